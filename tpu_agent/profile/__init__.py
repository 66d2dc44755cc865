"""tpu_agent.profile"""
