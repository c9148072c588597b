"""What the kernel *_vs_pytorch benchmarks share: their command line and
the PyTorch side's timing."""
import argparse
import statistics


def parse_args():
    """--build (weft's build folder), --repeats (timed runs, PyTorch; weft
    runs a quarter as many repetitions, each of many iterations) and
    --warmup (untimed runs first)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    return ap.parse_args()


def median_ms(torch, fn, warmup, repeats, before_each=None):
    """Milliseconds: the median of CUDA-event-timed runs of fn after `warmup`
    untimed runs; before_each (optional) runs untimed before each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        if before_each:
            before_each()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
