"""``packer.ray_executor.RayExecutor``, the name docs/DISTRIBUTED.md gives for library use: the
executor lives in ``packer.run.ray_executor`` with the other executors; this path stays for users."""

from packer.run.ray_executor import RayExecutor

__all__ = ["RayExecutor"]
