# p50 of a background bash start over MCP stdio (`tools/call` bash with
# run_in_background → the task id), [state] store = "sqlite" against "memory"
# in the same run: 3 rounds of each, alternating, N starts per round (the
# first 5 dropped), each start's task waited for before the next.
# Usage: python3 host/benches/durable_start.py target/debug/taskhost 60 [--owner]
# (issue 31's goal: sqlite ≤ 1.3× memory at p50). With --owner both servers
# run `serve --owner bench`: a stable owner, so under sqlite each command is
# a durable tree (handed over), under memory a plain one. Not a cargo bench: it
# drives the built binary like a client, with Python's standard library only.
import json, subprocess, sys, time, os, statistics, tempfile
BIN = sys.argv[1]; N = int(sys.argv[2]); OWNER = ["--owner", "bench"] if "--owner" in sys.argv[3:] else []
def run(store):
    d = tempfile.mkdtemp(prefix=f"durable-bench-{store}-")
    state = d + "/state"
    cfg = d + "/t.toml"
    open(cfg, "w").write(f'[state]\ndir = "{state}"\nstore = "{store}"\n[tasks]\nmax_live_tasks_per_owner = 10\n')
    env = dict(os.environ, RUST_LOG="warn")
    # the configuration is outside the server's writable roots (its working directory is d/work)
    os.makedirs(d + "/work")
    p = subprocess.Popen([BIN, "serve", "--config", cfg] + OWNER, cwd=d + "/work", stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(d + "/err", "w"), env=env, text=True, bufsize=1)
    n = 0
    def rpc(method, params, notify=False):
        nonlocal n
        msg = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            n += 1; msg["id"] = n
        p.stdin.write(json.dumps(msg) + "\n"); p.stdin.flush()
        if notify: return None
        while True:
            line = p.stdout.readline()
            if not line: raise SystemExit(open(d + "/err").read())
            r = json.loads(line)
            if r.get("id") == n: return r
    rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "0"}})
    rpc("notifications/initialized", {}, notify=True)
    times = []
    for i in range(N):
        t = time.perf_counter()
        r = rpc("tools/call", {"name": "bash", "arguments": {"command": "true", "run_in_background": True}})
        times.append(time.perf_counter() - t)
        task_id = r["result"]["_meta"]["taskhost/started-task"]  # the started task's id, as data
        # the task settles; wait for it so the live cap is never hit
        rpc("tools/call", {"name": "task_output", "arguments": {"task_id": task_id, "wait": True}})
    p.stdin.close(); p.wait(timeout=30)
    return statistics.median(times[5:]) * 1e3
mem, sql = [], []
for _ in range(3):
    mem.append(run("memory")); sql.append(run("sqlite"))
print("memory p50 ms per round:", [round(x, 2) for x in mem])
print("sqlite p50 ms per round:", [round(x, 2) for x in sql])
print("ratio sqlite/memory (median of rounds): %.3f" % (statistics.median(sql) / statistics.median(mem)))
