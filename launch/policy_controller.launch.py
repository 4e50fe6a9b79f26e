"""ROS 2 launch file for the her_mpi policy controller.

    ros2 launch launch/policy_controller.launch.py model_path:=/path/policy.onnx [rate_hz:=25.0]
        [observation_topic:=/robot/observation] [goal_topic:=/robot/goal] [action_topic:=/robot/action]
        [goal_type:=point] [params_file:=/path/my_params.yaml]
        [managed:=true [autostart:=true]]

The node is the pip-installed ``her_mpi_runtime.ros_node`` (no colcon package needed), started
with the parameters in ``policy_controller.yaml`` next to this file; the arguments override them.
``managed:=true`` starts the lifecycle variant ``her_mpi_runtime.lifecycle_node`` instead: it waits
unconfigured for ``ros2 lifecycle set /her_policy_controller configure`` then ``activate`` (or a
lifecycle manager), unless ``autostart:=true``.
"""

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, ExecuteProcess
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration

HERE = os.path.dirname(os.path.abspath(__file__))

ARGUMENTS = [
    ("model_path", None, "the .onnx policy written by python -m her_mpi.export"),
    ("rate_hz", "0.0", "action rate; 0 uses the policy's control period"),
    ("observation_topic", "observation", "std_msgs/Float64MultiArray observation topic"),
    ("goal_topic", "desired_goal", "goal topic"),
    ("goal_type", "array", "array (Float64MultiArray), point (PointStamped) or pose (PoseStamped)"),
    ("action_topic", "action", "std_msgs/Float64MultiArray action topic"),
    ("input_timeout_s", "0.5", "inputs older than this give the safe action"),
    ("diagnostics_topic", "/diagnostics", "diagnostic_msgs/DiagnosticArray topic, once a second"),
    ("params_file", os.path.join(HERE, "policy_controller.yaml"), "YAML with the node's parameters"),
    ("managed", "false", "true: the lifecycle (managed) node, started unconfigured"),
    ("autostart", "false", "managed node only: configure and activate at start"),
    ("python", "python3", "interpreter with her_mpi_runtime installed"),
]
NOT_PARAMETERS = ("params_file", "managed", "autostart", "python")


def controller(module, condition, extra_parameters=()):
    overrides = []
    for name, _, _ in ARGUMENTS:
        if name not in NOT_PARAMETERS:
            overrides += ["-p", [name, ":=", LaunchConfiguration(name)]]
    for name in extra_parameters:
        overrides += ["-p", [name, ":=", LaunchConfiguration(name)]]
    return ExecuteProcess(
        cmd=[LaunchConfiguration("python"), "-m", module, "--ros-args", "-r", "__node:=her_policy_controller",
             "--params-file", LaunchConfiguration("params_file"), *overrides],
        name="her_policy_controller", output="screen", condition=condition)


def generate_launch_description():
    declared = [DeclareLaunchArgument(name, description=text, **({} if default is None else {"default_value": default}))
                for name, default, text in ARGUMENTS]
    managed = LaunchConfiguration("managed")
    return LaunchDescription(declared + [
        controller("her_mpi_runtime.ros_node", UnlessCondition(managed)),
        controller("her_mpi_runtime.lifecycle_node", IfCondition(managed), extra_parameters=["autostart"]),
    ])
