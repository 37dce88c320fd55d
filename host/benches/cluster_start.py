# Start → id of a background bash start over MCP stdio on a cluster node
# (`serve --cluster`, a real 3-node NATS JetStream cluster on loopback that
# this script starts with Debian's nats-server) against the single-machine
# durable start ([state] store = "sqlite"), in the same run: 3 rounds of
# each, alternating, N starts per round (the first 5 dropped), each start's
# task waited for before the next. Also, per start: the taskhost server's
# CPU (utime + stime from /proc), the NATS servers' CPU, and the messages
# the NATS servers took in (the sum of /varz in_msgs over the 3 nodes: the
# node's requests and publishes, plus the cluster's own replication and
# route traffic) — so the throughput of N real machines can be estimated
# as starts per second per core. Issue 33's goal: cluster p50 ≤ 1.5× sqlite.
# Usage: python3 host/benches/cluster_start.py target/debug/taskhost 40 [--owner]
# (--owner: both servers run `serve --owner bench`, a stable owner, so each
# command is a durable tree). Not a cargo bench: it drives the built binary
# like a client, with Python's standard library only.
import json, os, shutil, socket, statistics, subprocess, sys, tempfile, time, urllib.request

BIN = os.path.abspath(sys.argv[1]); N = int(sys.argv[2])
OWNER = ["--owner", "bench"] if "--owner" in sys.argv[3:] else []
TICKS = os.sysconf("SC_CLK_TCK")


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def nats_binary():
    for d in os.environ.get("PATH", "").split(":") + ["/usr/sbin", "/usr/local/sbin"]:
        if os.path.isfile(os.path.join(d, "nats-server")):
            return os.path.join(d, "nats-server")
    raise SystemExit("nats-server is not installed: apt-get install nats-server (bash .ci/setup does it)")


class Nats:
    def __init__(self, root):
        self.password = os.urandom(16).hex()
        self.password_file = os.path.join(root, "nats-password")
        with open(os.open(self.password_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(self.password)
        ports = free_ports(9)
        self.client_ports, route_ports, self.monitor_ports = ports[0:3], ports[3:6], ports[6:9]
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in route_ports)
        self.procs = []
        for i in range(3):
            name = f"n{i + 1}"
            conf = os.path.join(root, f"{name}.conf")
            open(conf, "w").write(
                f"server_name: {name}\nlisten: 127.0.0.1:{self.client_ports[i]}\nhttp: 127.0.0.1:{self.monitor_ports[i]}\n"
                f"jetstream {{ store_dir: {json.dumps(os.path.join(root, name + '-store'))}, max_memory_store: 64MB, max_file_store: 2GB }}\n"
                f"authorization {{ users = [ {{ user: taskhost, password: \"{self.password}\" }} ] }}\n"
                f"cluster {{ name: bench, listen: 127.0.0.1:{route_ports[i]}, routes: [{routes}] }}\n")
            self.procs.append(subprocess.Popen([nats_binary(), "-c", conf], stdout=subprocess.DEVNULL,
                                               stderr=open(os.path.join(root, name + ".log"), "w")))
        # Ready once every node's monitor names a JetStream meta leader.
        deadline = time.time() + 60
        while True:
            try:
                if all(self.get(i, "jsz").get("meta_cluster", {}).get("leader") for i in range(3)):
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit("the NATS cluster never elected a JetStream meta leader")
            time.sleep(0.1)

    def get(self, i, what):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor_ports[i]}/{what}", timeout=5) as r:
            return json.load(r)

    def counters(self):
        msgs = sum(self.get(i, "varz")["in_msgs"] for i in range(3))
        cpu = sum(cpu_seconds(p.pid) for p in self.procs)
        return msgs, cpu

    def urls(self):
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def stop(self):
        for p in self.procs:
            p.kill()
            p.wait()


class Server:
    """`taskhost serve` over stdio MCP in a directory of its own."""

    def __init__(self, store, nats, node, owner):
        self.d = tempfile.mkdtemp(prefix=f"cluster-bench-{store}-")
        cfg = self.d + "/t.toml"
        text = f'[state]\ndir = "{self.d}/state"\nstore = "sqlite"\n[tasks]\nmax_live_tasks_per_owner = 10\n'
        args = []
        if store == "cluster":
            text += (f'[cluster]\nname = "bench"\nnode = "{node}"\nuser = "taskhost"\n'
                     f'password_file = {json.dumps(nats.password_file)}\n')
            args = ["--cluster", nats.urls()]
        open(cfg, "w").write(text)
        os.makedirs(self.d + "/work")
        env = dict(os.environ, RUST_LOG="warn")
        self.p = subprocess.Popen([BIN, "serve", "--config", cfg] + owner + args, cwd=self.d + "/work",
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(self.d + "/err", "w"),
                                  env=env, text=True, bufsize=1)
        self.n = 0
        self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "b", "version": "0"}})
        self.rpc("notifications/initialized", {}, notify=True)

    def rpc(self, method, params, notify=False):
        msg = {"jsonrpc": "2.0", "method": method, "params": params}
        if not notify:
            self.n += 1
            msg["id"] = self.n
        self.p.stdin.write(json.dumps(msg) + "\n")
        self.p.stdin.flush()
        if notify:
            return None
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise SystemExit(open(self.d + "/err").read())
            r = json.loads(line)
            if r.get("id") == self.n:
                return r

    def call(self, tool, arguments):
        return self.rpc("tools/call", {"name": tool, "arguments": arguments})

    def stop(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)
        shutil.rmtree(self.d, ignore_errors=True)


def run(store, nats, round_no):
    server = Server(store, nats, f"bench-{round_no}", OWNER)
    p = server.p
    try:
        times = []
        before = None
        for i in range(N):
            if i == 5:
                before = (cpu_seconds(p.pid), nats.counters())
            t = time.perf_counter()
            r = server.call("bash", {"command": "true", "run_in_background": True})
            times.append(time.perf_counter() - t)
            task_id = r["result"]["_meta"]["taskhost/started-task"]
            server.call("task_output", {"task_id": task_id, "wait": True})
        host_cpu = cpu_seconds(p.pid) - before[0]
        msgs, nats_cpu = nats.counters()
        counted = N - 5
        return {
            "p50_ms": statistics.median(times[5:]) * 1e3,
            "host_cpu_ms": host_cpu / counted * 1e3,
            "nats_cpu_ms": (nats_cpu - before[1][1]) / counted * 1e3,
            "nats_msgs": (msgs - before[1][0]) / counted,
        }
    finally:
        server.stop()


def reads(nats, rounds=3, count=200):
    """p50 of a consuming task_output read of a task on node r-a, asked on
    r-a itself (local) and on r-b (forwarded), alternating, same owner."""
    a = Server("cluster", nats, "reads-a", ["--owner", "bench"])
    b = Server("cluster", nats, "reads-b", ["--owner", "bench"])
    try:
        r = a.call("bash", {"command": "while :; do echo line; sleep 0.001; done", "run_in_background": True})
        task_id = r["result"]["_meta"]["taskhost/started-task"]
        local, remote = [], []
        for _ in range(rounds):
            for server, into in ((a, local), (b, remote)):
                times = []
                for _ in range(count):
                    t = time.perf_counter()
                    server.call("task_output", {"task_id": task_id})
                    times.append(time.perf_counter() - t)
                into.append(statistics.median(times[5:]) * 1e3)
        a.call("task_kill", {"task_id": task_id})
        return local, remote
    finally:
        a.stop()
        b.stop()


root = tempfile.mkdtemp(prefix="cluster-bench-nats-")
nats = Nats(root)
try:
    results = {"sqlite": [], "cluster": []}
    for r in range(3):
        for store in ("sqlite", "cluster"):
            results[store].append(run(store, nats, r))
    for store, rounds in results.items():
        for key in ("p50_ms", "host_cpu_ms", "nats_cpu_ms", "nats_msgs"):
            print(f"{store:8} {key:12}", [round(x[key], 2) for x in rounds])
    med = lambda store, key: statistics.median(x[key] for x in results[store])
    ratio = med("cluster", "p50_ms") / med("sqlite", "p50_ms")
    print("ratio cluster/sqlite start p50 (median of rounds): %.3f" % ratio)
    per_start = (med("cluster", "host_cpu_ms") + med("cluster", "nats_cpu_ms")) / 1e3
    print("cluster CPU per start (host + NATS): %.2f ms -> %.0f starts/s per core" % (per_start * 1e3, 1 / per_start))
    print("NATS messages in per start (3 servers, replication included): %.1f" % med("cluster", "nats_msgs"))
    local, remote = reads(nats)
    print("consuming read p50 ms, local  per round:", [round(x, 3) for x in local])
    print("consuming read p50 ms, remote per round:", [round(x, 3) for x in remote])
    print("reads per second, remote / local (median of rounds): %.3f" % (statistics.median(local) / statistics.median(remote)))
finally:
    nats.stop()
    shutil.rmtree(root, ignore_errors=True)
