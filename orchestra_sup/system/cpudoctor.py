"""Which layers of the CPU policy (`[cpu]`, `system.cpupolicy`) work on this machine, and why not
(`orchestra-sup doctor`, its CPU part).

Each is probed as the tree would use it: real time by taking SCHED_FIFO on a short-lived thread,
the lanes' idle group by the writability of the cgroup it would be made in. "used" says what
`realtime = "auto"` and `lanes = "idle"` would take here (busy polling: used under "auto" only
where real time is refused, as a real-time front never busy-polls).
"""

from __future__ import annotations

import resource
from pathlib import Path

from orchestra_sup.system.cpupolicy import (
    RTTIME_HARD_MARGIN_S,
    CpuSettings,
    format_cpus,
    machine_cpus,
    realtime_refusal,
)
from orchestra_sup.system.doctorlayer import Layer
from orchestra_sup.system.lanecpu import layer_here
from orchestra_sup.system.v1cgroups import v1_controller

RT_RUNTIME = Path("/proc/sys/kernel/sched_rt_runtime_us")
LANE_LAYERS = ("cpu.idle cgroup", "cpu.shares cgroup", "SCHED_IDLE")
"""The layers `lanes = "idle"` chooses among, in its order (`system.lanecpu`)."""


def _rt_share() -> str:
    """How much of each CPU the kernel lets real time take, in words."""
    try:
        runtime = int(RT_RUNTIME.read_text())
    except (OSError, ValueError):
        return "the kernel's real-time share is unknown"
    if runtime < 0:
        return "the kernel lets real time take all of a CPU (sched_rt_runtime_us -1)"
    return f"the kernel lets real time take {runtime / 10_000:g}% of each CPU"


def cpu_layers(settings: CpuSettings | None = None) -> list[Layer]:
    """The CPU policy's layers, in the order the policy uses them (~1 ms). Never raises."""
    settings = settings or CpuSettings()
    refusal = realtime_refusal(settings.rt_priority)
    _soft, hard = resource.getrlimit(resource.RLIMIT_RTTIME)
    needed = int((settings.rttime_s + RTTIME_HARD_MARGIN_S) * 1e6)
    rttime_ok = hard == resource.RLIM_INFINITY or hard >= needed
    machine = machine_cpus()
    cpu_group = v1_controller("cpu")
    lanes = layer_here("idle")
    return [
        Layer(
            name="real time",
            available=refusal is None,
            detail=(
                f"SCHED_FIFO at priority {settings.rt_priority} is allowed; {_rt_share()}"
                if refusal is None
                else f"SCHED_FIFO refused: {refusal}"
            ),
            used=refusal is None,
        ),
        Layer(
            name="RLIMIT_RTTIME",
            available=rttime_ok,
            detail="hard limit "
            + ("unlimited" if hard == resource.RLIM_INFINITY else f"{hard} us")
            + ("" if rttime_ok else f": below rttime_s plus {RTTIME_HARD_MARGIN_S:g} s"),
            used=refusal is None and rttime_ok,
        ),
        Layer(
            name="affinity",
            available=len(machine) > 1,
            detail=f"CPUs {format_cpus(machine)}: reserved_cpus may name any of them"
            if len(machine) > 1
            else "one CPU only: nothing to reserve",
            used=False,  # reserved_cpus is the operator's choice, never automatic
        ),
        Layer(
            name="busy polling",
            available=len(machine) > 1,
            detail=f"the custodian's front busy-polls {settings.busy_poll_s * 1e6:g} us after "
            "each frame where it is in SCHED_OTHER (busy_poll_s; never in real time)"
            if len(machine) > 1
            else "one CPU only: no other thread could send the frame it would wait for",
            used=len(machine) > 1 and settings.busy_poll_s > 0 and refusal is not None,
        ),
        Layer(
            name="cpu.idle cgroup",
            available=lanes == "cpu.idle",
            detail=str(cpu_group) if cpu_group else "no writable v1 cpu hierarchy",
            used=lanes == "cpu.idle",
        ),
        Layer(
            name="cpu.shares cgroup",
            available=cpu_group is not None,
            detail="the least weight (2 of 1,024) where cpu.idle is missing"
            if cpu_group
            else "no writable v1 cpu hierarchy",
            used=lanes == "cpu.shares",
        ),
        Layer(
            name="SCHED_IDLE",
            available=True,
            detail="each lane command takes it unprivileged, where no cgroup serves",
            used=lanes == "sched_idle",
        ),
        Layer(name="nice", available=True, detail="[lanes] nice, always", used=True),
    ]
