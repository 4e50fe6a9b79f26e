"""her_mpi_runtime: run exported her_mpi policies on a robot with numpy and onnxruntime only.

    from her_mpi_runtime import Policy
    policy = Policy("policy.onnx")
    action = policy.act(observation, desired_goal)
"""

from her_mpi_runtime.policy import Policy, PolicyInputError, PolicyMetadata

__all__ = ["Policy", "PolicyInputError", "PolicyMetadata"]
__version__ = "0.1.0"
