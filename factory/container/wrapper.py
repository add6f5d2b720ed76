"""nvcc admission wrapper: every nvcc call of a build passes through here (PYTORCH_NVCC, or `nvcc` first on
PATH, is its launcher `nvcc` beside this file, which runs `python3 -m` this module).

A compile starts only when its predicted peak fits the cgroup's remaining memory, or, when its profile shows
a low front end (preprocessing, parsing), when that fits: it is then stopped (SIGSTOP of its process group)
as it rises past it, until its peak fits. Its real peak RSS, wall and CPU time and course are measured and
appended to a profile. Standard library only, like the whole of its package: it runs with the build
container's Python.

One waiting wrapper at a time (the holder of FACTORY_STATE_DIR/dispatch.lock) decides for every waiting
compile of the build and starts each that may start; the others only look for their grant file (`gate`). It
predicts them from their keys and estimates with its own profile and recipe figures: the wrappers of one
build share their environment. Between polls each wrapper naps on its doorbell (`bell`): a compile that ends
rings the waiting ones, a dispatcher rings those it started, so a core passes from one compile to the next
within milliseconds, not a poll or two.

Its environment is `protocol.WrapperEnv` (FACTORY_STATE_DIR, FACTORY_MEM_LIMIT, the recipe's estimates, ...).
A sharded build's compiles of other shards write empty objects (`shardskip`); a preflight compiles its first
candidate for its lowest arch only, and the other compiles stand in and are recorded (`preflightcompiles`).
With the compile cache (FACTORY_CACHE_DIR) a compile is looked up before it is admitted: a hit takes no slot
and no memory, writes its object (and depfile) and is measured as "cache": "hit".

The `c++` launcher beside `nvcc` (CXX when the cache is on, or in a preflight) runs this module with
--factory-cxx: the host compiler's compiles go through the cache too, unadmitted as they were before.

Each call's command line is parsed here once (`nvcccall.parse`); the parsed call is what the cache, the link
records, a shard's and a preflight's stand-ins and admission are handed, so they never read it apart.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import time

from . import admission, compilecache, links, nvcccall, preflightcompiles, protocol, shardskip
from .environ import log, read_cgroup, settings
from .gate import Admission
from .measure import append_measurement, mem_seconds, run_measured
from .predictor import Predictor, read_profile

DEFAULT_EST_PER_ARCH = 4 << 30
LAUNCHER = os.path.join(os.path.dirname(os.path.realpath(__file__)), "nvcc")
CXX_LAUNCHER = os.path.join(os.path.dirname(LAUNCHER), "c++")
CXX_FLAG = "--factory-cxx"


def real_nvcc(env: protocol.WrapperEnv) -> str:
    real = env.real_nvcc or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    if os.path.realpath(real) == LAUNCHER:
        sys.exit("factory-nvcc: FACTORY_REAL_NVCC points at the wrapper itself")
    if not (os.path.isfile(real) and os.access(real, os.X_OK)):
        sys.exit(f"factory-nvcc: no nvcc at {real} (set FACTORY_REAL_NVCC, or CUDA_HOME)")
    return real


def real_cxx(env: protocol.WrapperEnv) -> str:
    """FACTORY_REAL_CXX, else the first c++ on PATH that is not this launcher."""
    chosen = env.real_cxx or "c++"
    if os.sep not in chosen:
        here = os.path.dirname(CXX_LAUNCHER)
        path = os.pathsep.join(
            d for d in os.environ.get("PATH", "").split(os.pathsep) if d and os.path.realpath(d) != here
        )
        chosen = shutil.which(chosen, path=path) or ""
    if not chosen or os.path.realpath(chosen) == CXX_LAUNCHER:
        sys.exit("factory-c++: no host compiler (set FACTORY_REAL_CXX)")
    return chosen


def cache_attempt(compiler: str, call: nvcccall.NvccCall) -> compilecache.Attempt | str:
    """The cache's view of a compile; a cache that fails in any way is no cache, never a failed build."""
    try:
        return compilecache.attempt(call, compiler)
    except (OSError, ValueError) as exc:
        log(f"compile cache skipped: {exc}")
        return "error"


def serve_from_cache(
    cached: compilecache.Attempt | str, record: dict[str, object], env: protocol.WrapperEnv
) -> bool:
    """Answer the call from the cache when it holds it: outputs written, a hit's measurement printed."""
    if not isinstance(cached, compilecache.Attempt):
        return False
    t0 = time.monotonic()
    try:
        hit = cached.serve()
    except (OSError, ValueError) as exc:
        log(f"compile cache lookup failed: {exc}")
        hit = False
    if hit:
        record.update(
            peak_bytes=0, wall_s=round(time.monotonic() - t0, 3), cpu_s=0.0, rc=0, cache=protocol.CACHE_HIT
        )
        emit(record, env)
        return True
    cached.start()
    return False


def cache_record(cached: compilecache.Attempt | str, record: dict[str, object]) -> None:
    """A compile's cache fields: whether it was looked up, and what checking a hit by compiling it found."""
    record["cache"] = cache_state(cached)
    if isinstance(cached, compilecache.Attempt) and cached.check is not None:
        assert cached.expected is not None
        record["cache_check"] = cached.check
        record["entry"] = f"{cached.direct_key}-{cached.expected.result_key}"


def cache_state(cached: compilecache.Attempt | str) -> str:
    return protocol.CACHE_MISS if isinstance(cached, compilecache.Attempt) else protocol.CACHE_OFF


def emit(record: dict[str, object], env: protocol.WrapperEnv) -> None:
    if env.profile_out:
        append_measurement(env.profile_out, record)
    # the build log carries the measurement too: the host reads it from there when the state dir is out of
    # reach
    print(protocol.measurement_line(record), file=sys.stderr, flush=True)


def cxx_main(argv: list[str]) -> int:
    """The host compiler through the cache: a hit writes the object, a miss compiles (unadmitted) and is
    stored; anything else runs as it is."""
    env = settings()
    cxx = real_cxx(env)
    call = nvcccall.parse(argv, nvcccall.CXX)
    link = links.link_of(call, os.getcwd())
    if link is not None:
        # before it runs: a link that fails still said what it linked
        print(protocol.link_line(link), file=sys.stderr, flush=True)
        if preflightcompiles.candidates() is not None:
            return preflightcompiles.stand_in_link(cxx, call)
        os.execv(cxx, [cxx, *argv])
    cached = cache_attempt(cxx, call)
    if not isinstance(cached, compilecache.Attempt):
        return run_plain(compilecache.plain(call), cxx)
    record: dict[str, object] = {
        "key": protocol.compile_key(cached.call.source, ("host",), 1),
        "source": os.path.basename(cached.call.source),
        "tool": "cxx",
    }
    compiled = links.output_of(call, os.getcwd())
    if compiled is not None:
        record["object"] = compiled
    if serve_from_cache(cached, record, env):
        return 0
    run = run_measured([cxx, *cached.run_args], interval=env.sample_s)
    cached.finish(run.code)
    record.update(
        peak_bytes=max((rss for _, rss in run.samples), default=0),
        wall_s=round(run.wall_s, 3),
        cpu_s=round(run.cpu_s, 3),
        rc=run.code,
    )
    cache_record(cached, record)
    emit(record, env)
    return run.code


def run_plain(call: compilecache.Plain, compiler: str) -> int:
    """A call the cache does not take, run as its misses are (`compilecache.plain`): the same object with
    the cache on or off. A call that is no compile is replaced by the compiler, as before."""
    if call.output is None:
        os.execv(compiler, [compiler, *call.run_args])
    code = subprocess.call([compiler, *call.run_args])
    call.finish(code)
    return code


def measured_as(call: nvcccall.NvccCall) -> dict[str, object]:
    """The start of a compile's measurement: its key, what it compiles, and the object it writes (the host
    tells from it which modules link nvcc's objects)."""
    assert call.source is not None
    record: dict[str, object] = {
        "key": protocol.compile_key(call.source, call.archs, call.threads),
        "source": os.path.basename(call.source),
        "archs": list(call.archs),
        "threads": call.threads,
    }
    compiled = links.output_of(call, os.getcwd())
    if compiled is not None:
        record["object"] = compiled
    return record


def select(call: nvcccall.NvccCall) -> nvcccall.NvccCall | None:
    """The call to compile, or None where a stand-in answers instead: a compile of another shard
    (`--shard`), or in a preflight every compile but its device compile, which keeps one arch, and the others
    are recorded, in case the build never makes that one (`--preflight`)."""
    assert call.source is not None
    shard = shardskip.shard_sources()
    if shard is not None and not shardskip.in_shard(call.source, shard):
        return None
    ranked = preflightcompiles.candidates()
    if ranked is None:
        return call
    if not shardskip.in_shard(call.source, ranked[:1]):
        preflightcompiles.record(call)
        return None
    return preflightcompiles.one_arch(call)


def main(argv: list[str]) -> int:
    if argv[:1] == [CXX_FLAG]:
        return cxx_main(argv[1:])
    env = settings()
    nvcc = real_nvcc(env)
    call = nvcccall.parse(argv)
    if not call.is_compile:
        os.execv(nvcc, [nvcc, *argv])
    chosen = select(call)
    if chosen is None:
        # before the cache's key, which would hash its inputs for nothing
        return shardskip.stand_in(call, record=measured_as(call))
    call = chosen  # a preflight's device compile has one arch left
    assert call.source is not None
    if preflightcompiles.candidates() is not None:
        preflightcompiles.mark_device(call.source, call.archs)
    record = measured_as(call)
    key = str(record["key"])
    state_dir = env.state_dir
    cached = cache_attempt(nvcc, call)
    uncached = None if isinstance(cached, compilecache.Attempt) else compilecache.plain(call)
    if not state_dir and uncached is not None:
        return run_plain(uncached, nvcc)
    # before admission: a hit takes no slot and no memory
    if serve_from_cache(cached, record, env):
        return 0
    if isinstance(cached, compilecache.Attempt):
        argv = list(cached.run_args)  # with a depfile of its own when the call named none, pinned
    else:
        assert uncached is not None
        argv = list(uncached.run_args)  # pinned as a miss would have been
    estimate = admission.compile_estimate(
        call.source,
        per_arch_bytes=env.est_per_arch_bytes or DEFAULT_EST_PER_ARCH,
        archs=len(call.archs),
        nvcc_threads=call.threads,
        base_bytes=admission.DEFAULT_BASE_BYTES if env.est_base_bytes is None else env.est_base_bytes,
        by_file=env.est_by_file,
    )
    predictor = Predictor(
        read_profile(env.profile_in, env.profile_json),
        after_peak=env.after_peak,
        seconds_by_file=env.seconds_by_file,
        measurements=env.profile_out,
    )
    prediction = predictor.predict(key, estimate)
    threads = max(1, min(call.threads, len(call.archs)))
    info = read_cgroup(env.cgroup_root)
    limit = env.mem_limit or info.memory_limit
    waited = stopped = 0.0
    if not env.admission or limit is None or not state_dir:
        # measured only: for comparisons, or with no limit anywhere there is nothing to protect
        run = run_measured([nvcc, *argv], interval=env.sample_s)
    else:
        gate = Admission(
            state_dir,
            limit=limit,
            info=info,
            threads=threads,
            waves=-(-len(call.archs) // threads),
            settings=env,
        )
        try:
            waited, prediction = gate.wait(key, estimate, predictor)
            refresh = functools.partial(predictor.predict, key, estimate)
            run = run_measured(
                [nvcc, *argv],
                on_sample=lambda rss, child: gate.sampled(rss, child, refresh),
                interval=env.sample_s,
            )
        finally:
            gate.release()
        stopped = gate.stopped_s
    code, samples, wall = run.code, run.samples, run.wall_s
    if isinstance(cached, compilecache.Attempt):
        cached.finish(code)
    elif uncached is not None:
        uncached.finish(code)
    peak = max((rss for _, rss in samples), default=0)
    record.update(
        {
            "peak_bytes": peak,
            "wall_s": round(wall, 3),
            "cpu_s": round(run.cpu_s, 3),
            "rc": code,
            "predicted_bytes": prediction.peak_bytes,
            "predicted_s": prediction.wall_s,
            "waited_s": round(waited, 3),
            "stopped_s": round(stopped, 3),  # at its rise, until its peak was granted (not in wall_s)
            "envelope": list(admission.envelope(samples, wall)),
            "rise": list(admission.rise(samples, wall)),
            "mem_s": round(mem_seconds(samples, wall)),
        }
    )
    cache_record(cached, record)
    emit(record, env)
    if peak > prediction.peak_bytes:
        log(
            f"{os.path.basename(call.source)} peaked at {peak / 2**30:.2f} GiB "
            f"over its {prediction.peak_bytes / 2**30:.2f} GiB estimate"
        )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
