"""Peak resident memory of a layerwise run, step by step: runs CMD, reads its progress lines
("layerwise: STEP (T s)", printed where stderr is no terminal) and samples the process's VmRSS
every 5 ms, then prints each step's peak (MiB) and the run's peak (VmHWM). For finding which step
sets the peak (docs/performance.md, "In the memory of the floor"); stderr is passed through.

usage: python3 scripts/bench/rss_steps.py CMD [ARG]...
"""
import subprocess
import sys
import threading
import time

proc = subprocess.Popen(sys.argv[1:], stderr=subprocess.PIPE, text=True)
step = ["(start)"]
peaks = {}
order = []


def read_steps():
    for line in proc.stderr:
        sys.stderr.write(line)
        if line.startswith("layerwise: ") and line.rstrip().endswith("s)"):
            step[0] = line[len("layerwise: "):].rsplit(" (", 1)[0]


def rss_kib(field):
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


reader = threading.Thread(target=read_steps, daemon=True)
reader.start()
hwm = 0
while proc.poll() is None:
    rss = rss_kib("VmRSS:")
    hwm = max(hwm, rss_kib("VmHWM:") or 0)
    if rss is not None:
        if step[0] not in peaks:
            order.append(step[0])
        peaks[step[0]] = max(peaks.get(step[0], 0), rss)
    time.sleep(0.005)
reader.join(timeout=5)
for s in order:
    print(f"  {peaks[s] / 1024:8.1f} MiB  {s}")
print(f"  {hwm / 1024:8.1f} MiB  peak (VmHWM), exit {proc.returncode}")
sys.exit(proc.returncode)
