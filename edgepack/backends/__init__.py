"""Backends: what differs between a CPU, an OpenCL GPU and a Vulkan GPU, behind one interface.

Each module of this package that defines a backend registers it when it is imported, and importing
the package imports every module in it: adding a backend is adding a module (and profiles naming it).
``backend_for(profile_or_manifest)`` is how the rest of edgepack reaches one.
"""

import importlib
import pkgutil

from edgepack.backends.base import (
    Backend,
    Build,
    DoctorCheck,
    KernelForm,
    ScheduledFunction,
    ScheduleReport,
    TuningLayout,
    TuningRecords,
    backend_for,
    backends,
    describe_device,
    get_backend,
    register,
    target_dict,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["Backend", "Build", "DoctorCheck", "KernelForm", "ScheduleReport", "ScheduledFunction", "TuningLayout", "TuningRecords",
           "backend_for", "backends", "describe_device", "get_backend", "register", "target_dict"]
