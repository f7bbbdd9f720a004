"""What the served GPU checks (serve_check.py, serve_real.py, serve_paused.py) share: a JSON
POST that reports the server's error body, the wait for /health, the pause and resume
counters from /metrics, callables run at once, and a load repeated until it pauses
something. Stdlib only; tools/gpu/stage.sh copies it beside the scripts."""
import json
import sys
import threading
import time
import urllib.error
import urllib.request


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:  # the server's reason, not just the status
        raise RuntimeError(f"{path}: HTTP {e.code}: {e.read().decode(errors='replace')}") from None


def wait_healthy(url, tries):
    """Polls /health every half second, `tries` times; exits the script if it never answers."""
    for _ in range(tries):
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            return
        except Exception:
            time.sleep(0.5)
    sys.exit("server never became healthy")


def counters(url):
    """genslot_pauses_total and every genslot_resumes_total sample, by their metric line's name."""
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(("genslot_pauses_total", "genslot_resumes_total")):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def concurrent(jobs):
    """Runs the callables at once, one thread each; their results in order."""
    out = [None] * len(jobs)

    def run(i):
        out[i] = jobs[i]()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def load_until_paused(url, run_load, attempts):
    """Runs `run_load()` (one closed-loop load; it returns the load's outputs) until the
    server's pause counter has moved, at most `attempts` times. Whether a load pauses anything
    depends on how its waits fall around X: a steady load whose waits come out even keeps
    every head of the queue on time, and a load that paused nothing checks nothing about
    pausing. Returns the outputs of every load run, the pauses they made together, and their
    seconds."""
    before = counters(url).get("genslot_pauses_total", 0.0)
    t0, loads, moved = time.time(), [], 0.0
    for _ in range(max(1, attempts)):
        loads.append(run_load())
        moved = counters(url).get("genslot_pauses_total", 0.0) - before
        if moved > 0:
            break
    return loads, moved, time.time() - t0
