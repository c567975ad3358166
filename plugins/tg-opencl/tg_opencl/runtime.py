"""Loads a program binary for one OpenCL device and launches its kernel on that device's queue."""

from __future__ import annotations

import re
import time
from typing import Any, Optional

import numpy as np

from tg_opencl.allocator import BufferView
from tg_opencl.cl_platform import get_platform
from tg_opencl.compiler import SOURCE_KEY, unpack_binaries
from tgcore.plugin import Program


class OpenCLProgram(Program):
    """One kernel of a built program, on device `device` ("OPENCL" or "OPENCL:N")."""

    def __init__(self, device: str, name: str, lib: bytes) -> None:
        import pyopencl as cl

        super().__init__(device, name, lib)
        self.platform = get_platform()
        index = self.platform.index(device)
        self.cl_device, self.queue = self.platform.devices[index], self.platform.queues[index]
        self.profiling = self.platform.infos[index].profiling
        key = self.platform.infos[index].build_key
        binaries = unpack_binaries(lib)
        if key not in binaries:
            raise ValueError(f"the program {name} was built for {sorted(binaries)}, not for {device} ({key})")
        self.writes = written_arguments(binaries.get(SOURCE_KEY, b"").decode(errors="replace"), name)
        self.program = cl.Program(self.platform.context, [self.cl_device], [binaries[key]]).build()
        self.kernel = cl.Kernel(self.program, name)
        # a kernel with local indices, local memory or barriers declares its work-group size (see renderer.py)
        required = self.kernel.get_work_group_info(cl.kernel_work_group_info.COMPILE_WORK_GROUP_SIZE, self.cl_device)
        self.required_local: Optional[tuple[int, ...]] = tuple(required) if any(required) else None

    def __call__(
        self,
        *bufs: Any,
        global_size: Optional[tuple[int, ...]] = None,
        local_size: Optional[tuple[int, ...]] = None,
        vals: tuple[int, ...] = (),
        wait: bool = False,
    ) -> Optional[float]:
        import pyopencl as cl

        copies: list[tuple[Any, BufferView]] = []
        for i, b in enumerate(bufs):
            if isinstance(b, BufferView):
                if b.sub is None:  # a view OpenCL cannot make a sub-buffer of: the kernel works on a copy
                    tmp = cl.Buffer(self.platform.context, cl.mem_flags.READ_WRITE, max(b.size, 1))
                    if b.size:
                        cl.enqueue_copy(self.queue, tmp, b.root, byte_count=b.size, src_offset=b.offset)
                    if self.writes is None or (i < len(self.writes) and self.writes[i]):
                        copies.append((tmp, b))
                    b = tmp
                else:
                    b = b.sub
            self.kernel.set_arg(i, b)
        for i, v in enumerate(vals, start=len(bufs)):
            self.kernel.set_arg(i, np.int32(v))
        grid = tuple(global_size) if global_size is not None else (1,)
        if self.required_local is not None:
            local = tuple(local_size) if local_size is not None else self.required_local[: len(grid)]
            if tuple(local) + (1,) * (3 - len(local)) != self.required_local:
                raise ValueError(
                    f"kernel {self.name} was rendered for work-groups of {self.required_local}, launched with {local}"
                )
            work: tuple[int, ...] = tuple(g * n for g, n in zip(grid, local))
            groups: Optional[tuple[int, ...]] = local
        else:  # global ids only: the driver picks the work-group size
            work, groups = grid, None
        if any(w == 0 for w in work):
            return 0.0 if wait else None
        st = time.perf_counter()
        event = cl.enqueue_nd_range_kernel(self.queue, self.kernel, work, groups)
        for tmp, view in copies:
            if view.size:
                cl.enqueue_copy(self.queue, view.root, tmp, byte_count=view.size, dst_offset=view.offset)
        if not wait:
            return None
        event.wait()
        if self.profiling:
            return (event.profile.end - event.profile.start) * 1e-9
        return time.perf_counter() - st


def written_arguments(src: str, name: str) -> Optional[list[bool]]:
    """For each argument of kernel `name` in `src`, whether the kernel may write through it (a pointer that is not
    to const); None when the signature cannot be found."""
    m = re.search(rf"\bvoid\s+{re.escape(name)}\s*\(([^)]*)\)", src)
    if m is None:
        return None
    args = [a.strip() for a in m.group(1).split(",")] if m.group(1).strip() else []
    return ["*" in a and "const" not in a.split("*")[0].split() for a in args]
