"""Turn results into text for a terminal. Nothing here computes; it only formats."""

from __future__ import annotations

from trainfit.format import OOM_NEED, fmt_bytes, fmt_num, format_duration, parts_line, table
from trainfit.probe.measurement import Measurement, first_sights_of

UNSTABLE = ("NOT stable (step/time cap hit: raise probe.max_seconds or probe.max_steps for a tighter "
            "estimate)")


def speed_rows(m: Measurement) -> list[tuple[str, str]]:
    """Which batches the speeds stand for, and the timed shapes the epoch's cost was fitted on."""
    rows = []
    if m.speed_basis:
        padding = f"; {m.padding_share:.0%} of positions are padding" if m.padding_share is not None else ""
        rows.append(("batches", f"{m.speed_basis}{padding}"))
    if m.shape_times:
        shapes = ", ".join(f"{s['rows']}x{s['padded_length']} {s['seconds']:.3g}s" for s in m.shape_times)
        fit = f"; the fit misses a timed shape by {m.fit_error_rel:.1%} at most" if m.fit_error_rel is not None else ""
        rows.append(("timed shapes", f"{shapes} (median seconds per step){fit}"))
    if m.data == "real" and m.data_wait_s is not None:
        workers = m.config.get("num_workers", 0)
        rows.append(("data", f"the dataset's rows through a DataLoader ({workers or 'no'} worker{'s' * (workers != 1)}): "
                             f"{m.data_wait_s * 1000:.3g} ms a step waiting for them "
                             f"({m.input_bound_share or 0:.1%} of the timed steps' time)"))
    elif m.data == "synthetic":
        rows.append(("data", "synthetic inputs made on the device (nothing loaded)"))
    if m.first_sights_s is not None and m.first_sight_s is not None and m.epoch_shapes:
        first = first_sights_of(m.first_sights_s, m.first_sight_s, m.epoch_shapes, 1)
        later = f"{m.first_sight_s * 1000:.3g} ms" if m.first_sight_s else "0 (none beyond the noise)"
        rows.append(("new lengths", f"{m.epoch_shapes:,} padded lengths an epoch; met the first time, the first new "
                                    f"one took {first * 1000:.3g} ms more, each later one {later}: "
                                    f"{m.first_sights_s * 1000:.3g} ms a fresh run pays once, shared out in the speeds"))
    if m.expected_step_time_s is not None:
        rows.append(("expected step", f"{m.expected_step_time_s:.4g} s over a first epoch's batches"))
    return rows


def measurement_report(m: Measurement) -> str:
    rows: list[tuple[str, str]] = [("status", m.status.upper() if m.status != "ok" else "ok")]
    if m.status == "ok":
        ci = f" +-{m.step_time_ci95_rel:.1%} (95% CI)" if m.step_time_ci95_rel is not None else ""
        rows += [
            ("samples/s", fmt_num(m.samples_per_second)),
            ("tokens/s", f"{fmt_num(m.tokens_per_second)} (real tokens, padding excluded)"),
            ("timed steps", f"{m.step_time_median_s:.4g} s median, {m.step_time_mean_s:.4g} s mean{ci}, "
                            f"{m.steps_measured} steps, {'stable' if m.stable else m.cut_short or UNSTABLE}"),
            ("per step", f"{fmt_num(m.samples_per_step)} samples, {fmt_num(m.real_tokens_per_step)} real / "
                         f"{fmt_num(m.padded_tokens_per_step)} padded tokens (the epoch's mean)"),
        ]
        rows += speed_rows(m)
    kind = "max reserved (CUDA allocator)" if m.device.startswith("cuda") else "peak RSS of the probe process"
    mem = f"{fmt_bytes(m.peak_memory_bytes)} ({kind})"
    if m.budget_memory_gb is not None and m.status in ("ok", "oom"):
        verdict = "fits" if m.fits else "does NOT fit"
        mem += f"; budget {m.budget_memory_gb:g} GiB - headroom {m.budget_headroom_gb:g} GiB: {verdict}"
    rows.append(("peak memory", mem))
    if m.world_size > 1:
        peaks = ", ".join(fmt_bytes(p) for p in m.rank_peak_memory_bytes)
        comm = "" if m.communication_share is None else \
            f"; syncing the gradients {m.communication_share:.0%} of a step"
        rows.append(("processes", f"{m.world_size} ({m.config.get('parallel')}); speeds are all of theirs; "
                                  f"peak per rank {peaks} (the largest decides){comm}"))
    if m.memory_parts_bytes:
        rows.append(("of which", parts_line(m.memory_parts_bytes)))
    if m.oom_needed_bytes:
        rows.append(("needs", f"more than {fmt_bytes(m.oom_needed_bytes)} ({OOM_NEED})"))
    if m.alloc_retries:
        rows.append(("alloc retries", str(m.alloc_retries)))
    if m.status == "ok":
        mfu = "n/a (no peak FLOP/s on record for this device)" if m.mfu is None else \
            f"{m.mfu:.1%} (HFU {m.hfu:.1%}; peak from {m.peak_flops_source})"
        rows.append(("MFU", mfu))
    if m.worst_case_lengths:
        rows.append(("worst-case batch", f"{len(m.worst_case_lengths)} x {max(m.worst_case_lengths)} "
                                         f"(the longest samples)"))
    threads = f", {m.cpu_threads} threads" if m.cpu_threads and m.device == "cpu" else ""
    rows.append(("device", f"{m.device} ({m.device_name}{threads})" if m.device_name else m.device))
    if m.phases_s:
        phases = ", ".join(f"{k} {v:.1f}s" for k, v in m.phases_s.items())
        rows.append(("time", f"{phases}; wall {format_duration(m.wall_time_s)} ({m.wall_time_s:.1f}s)"
                     if m.wall_time_s else phases))
    for note in m.notes:
        rows.append(("note", note))
    out = table(rows)
    if m.message:
        out += "\n\n" + m.message
    return out
