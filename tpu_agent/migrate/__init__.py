"""tpu_agent.migrate"""
