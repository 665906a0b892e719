"""Places to run a build: this machine (its CPU or GPU), the emulator (qemu-user), a device over SSH, or a
farm of devices; one parser for ``--on``, and what a run or a benchmark there returns."""
