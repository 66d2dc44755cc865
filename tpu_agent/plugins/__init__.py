"""tpu_agent.plugins"""
