"""RLlib PPO planners for ResiliBench-v0."""
