"""Analyses the migrate rules consult: small modules over the stdlib ``ast`` of one file, computed on demand."""
