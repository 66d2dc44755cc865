"""tpu_agent.runtime"""
