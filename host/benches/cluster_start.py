# Start → id of a background bash start over MCP stdio on a cluster node
# (`serve --cluster`, a real 3-node NATS JetStream cluster on loopback that
# this script starts with Debian's nats-server) against the single-machine
# durable start ([state] store = "sqlite"), in the same run: 3 rounds of
# each, alternating, N starts per round (the first 5 dropped), each start's
# task waited for before the next. Also, per start: the taskhost server's
# CPU (utime + stime from /proc), the NATS servers' CPU, and messages
# counted two ways: what the 3 servers took in and sent out (/varz in_msgs,
# out_msgs: the node's traffic plus JetStream's replication and routes), and
# what the taskhost node itself sent and was sent (/connz in_msgs, out_msgs
# of its client connection: every publish and request it made, every reply
# and delivery it got). Then, untimed, the node's sent messages split into
# those of the start call and those of the task's end. So the throughput of
# N real machines can be estimated as starts per second per core. Issue 33's
# goal: cluster p50 ≤ 1.5× sqlite. Last, a consuming read of a task on node a
# asked on node b (forwarded) against asked on a.
# Usage: python3 host/benches/cluster_start.py target/debug/taskhost 40 [--owner]
# (--owner: both servers run `serve --owner bench`, a stable owner, so each
# command is a durable tree). Not a cargo bench: it drives the built binary
# like a client, with Python's standard library only; every process and
# temporary directory it made is gone when it ends, on an error too.
import base64, json, os, shutil, socket, statistics, subprocess, sys, tempfile, time, urllib.request

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
        self.root = root
        ports = free_ports(9)
        self.client_ports, self.route_ports, self.monitor_ports = ports[0:3], ports[3:6], ports[6:9]
        self.procs = []

    def start(self):
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.route_ports)
        for i in range(3):
            name = f"n{i + 1}"
            conf = os.path.join(self.root, f"{name}.conf")
            open(conf, "w").write(
                f"server_name: {name}\nlisten: 127.0.0.1:{self.client_ports[i]}\nhttp: 127.0.0.1:{self.monitor_ports[i]}\n"
                f"jetstream {{ store_dir: {json.dumps(os.path.join(self.root, name + '-store'))}, max_memory_store: 64MB, max_file_store: 4GB }}\n"
                f"authorization {{ users = [ {{ user: taskhost, password: \"{self.password}\" }} ] }}\n"
                f"cluster {{ name: bench, listen: 127.0.0.1:{self.route_ports[i]}, routes: [{routes}] }}\n")
            self.procs.append(subprocess.Popen([nats_binary(), "-c", conf], stdout=subprocess.DEVNULL,
                                               stderr=open(os.path.join(self.root, name + ".log"), "w")))

    def wait_ready(self):
        """Ready once every node's monitor names a JetStream meta leader."""
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
        """What the 3 servers counted so far, summed: messages in and out of
        each server (/varz: clients, routes and JetStream's own replication),
        the messages the taskhost node itself sent and was sent (/connz: the
        node is the only client connection, the monitor is HTTP), and the
        servers' CPU seconds."""
        varz = [self.get(i, "varz") for i in range(3)]
        conns = self.node_connections()
        return {
            "in": sum(v["in_msgs"] for v in varz),
            "out": sum(v["out_msgs"] for v in varz),
            "node_sent": sum(c["in_msgs"] for c in conns),
            "node_got": sum(c["out_msgs"] for c in conns),
            "cpu": sum(cpu_seconds(p.pid) for p in self.procs),
        }

    def node_connections(self):
        """The taskhost nodes' client connections (named `taskhost <node>`)."""
        return [c for i in range(3) for c in self.get(i, "connz").get("connections") or []
                if c.get("name", "").startswith("taskhost ")]

    def node_sent(self):
        return sum(c["in_msgs"] for c in self.node_connections())

    def urls(self):
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


class NatsClient:
    """A bare NATS protocol client (a socket, requests with replies on an
    inbox) for the floor: what one JetStream write costs with no taskhost."""

    def __init__(self, nats):
        self.sock = socket.create_connection(("127.0.0.1", nats.client_ports[0]), timeout=10)
        self.buf = b""
        self.n = 0
        self.line()  # INFO
        connect = {"verbose": False, "pedantic": False, "user": "taskhost", "pass": nats.password,
                   "headers": True, "no_responders": True, "protocol": 1, "name": "bench floor"}
        self.sock.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\nSUB _INBOX.floor.* 1\r\nPING\r\n")
        while self.line() != b"PONG":
            pass

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("NATS closed the floor client's connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        if line.startswith(b"-ERR"):
            raise SystemExit(f"NATS: {line.decode()}")
        return line

    def exactly(self, size):
        while len(self.buf) < size + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("NATS closed the floor client's connection")
            self.buf += chunk
        data, self.buf = self.buf[:size], self.buf[size + 2:]
        return data

    def request(self, subject, payload, headers=None):
        """Publishes `payload` (with `headers`) and returns the reply's body."""
        self.n += 1
        inbox = f"_INBOX.floor.{self.n}".encode()
        if headers:
            head = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n"
            self.sock.sendall(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), inbox, len(head),
                                                                 len(head) + len(payload), head, payload))
        else:
            self.sock.sendall(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), inbox, len(payload), payload))
        while True:
            line = self.line()
            if line == b"PING":
                self.sock.sendall(b"PONG\r\n")
                continue
            parts = line.split()
            if parts[0] == b"MSG":
                body = self.exactly(int(parts[-1]))
            elif parts[0] == b"HMSG":
                raw = self.exactly(int(parts[-1]))
                body = raw[int(parts[-2]):]
            else:
                continue
            if parts[1] == inbox:
                return body

    def close(self):
        self.sock.close()


def record_size(nats, task_id):
    """The size of task `task_id`'s record in the bucket (its latest value),
    None when it has none."""
    client = NatsClient(nats)
    try:
        answer = json.loads(client.request("$JS.API.STREAM.MSG.GET.KV_taskhost-bench",
                                           json.dumps({"last_by_subj": f"$KV.taskhost-bench.task.{task_id}"}).encode()))
        if "message" not in answer:
            return None
        return len(base64.b64decode(answer["message"].get("data", ""))) or None
    finally:
        client.close()


def floor(nats, size, rounds=3, count=200):
    """p50 of one create-only publish (Nats-Expected-Last-Subject-Sequence:
    0, as a start record) of `size` bytes into a 3-replica file stream made
    like the bucket's, from a bare client: the least a start on the cluster
    can wait for its record, with no taskhost in the way."""
    client = NatsClient(nats)
    try:
        config = {"name": "FLOOR", "subjects": ["floor.>"], "max_msgs_per_subject": 1, "storage": "file",
                  "num_replicas": 3, "discard": "new", "allow_rollup_hdrs": True, "deny_delete": True,
                  "allow_direct": False}
        created = json.loads(client.request("$JS.API.STREAM.CREATE.FLOOR", json.dumps(config).encode()))
        if "error" in created:
            raise SystemExit(f"creating the floor stream: {created['error']}")
        payload = b"x" * size
        p50s = []
        for r in range(rounds):
            times = []
            for i in range(count):
                t = time.perf_counter()
                ack = json.loads(client.request(f"floor.{r}.{i}", payload, {"Nats-Expected-Last-Subject-Sequence": "0"}))
                times.append(time.perf_counter() - t)
                if "error" in ack:
                    raise SystemExit(f"floor publish refused: {ack['error']}")
            p50s.append(statistics.median(times[5:]) * 1e3)
        client.request("$JS.API.STREAM.DELETE.FLOOR", b"")
        return p50s
    finally:
        client.close()


class Server:
    """`taskhost serve` over stdio MCP in a directory of its own; used as a
    context manager, so the process is killed and the directory removed on
    every way out (an error included)."""

    def __init__(self, store, nats, node, owner):
        self.d = tempfile.mkdtemp(prefix=f"cluster-bench-{store}-")
        self.p = None
        try:
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
            self.rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "b", "version": "0"}})
            self.rpc("notifications/initialized", {}, notify=True)
        except BaseException:
            self.stop()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.stop()

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
                raise SystemExit("the server stopped: " + open(self.d + "/err").read())
            r = json.loads(line)
            if r.get("id") == self.n:
                return r

    def call(self, tool, arguments):
        r = self.rpc("tools/call", {"name": tool, "arguments": arguments})
        if "result" not in r or r["result"].get("isError"):
            raise SystemExit(f"{tool} failed: {json.dumps(r)[:2000]}")
        return r["result"]

    def start(self, command):
        """A background bash start; its task id (as data, from _meta)."""
        return self.call("bash", {"command": command, "run_in_background": True})["_meta"]["taskhost/started-task"]

    def stop(self):
        if self.p is not None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
            self.p = None
        shutil.rmtree(self.d, ignore_errors=True)


def run(store, nats, round_no):
    """One round: N starts, each waited for; p50 of start → id over all but
    the first 5, and per start over those: the server's CPU, the NATS
    servers' CPU and messages."""
    with Server(store, nats, f"bench-{round_no}", OWNER) as server:
        times = []
        before = None
        for i in range(N):
            if i == 5:
                before = (cpu_seconds(server.p.pid), nats.counters())
            t = time.perf_counter()
            task_id = server.start("true")
            times.append(time.perf_counter() - t)
            server.call("task_output", {"task_id": task_id, "wait": True})
        host_cpu = cpu_seconds(server.p.pid) - before[0]
        after = nats.counters()
        counted = N - 5
        per_start = {k: (after[k] - before[1][k]) / counted for k in after}
        return {
            "p50_ms": statistics.median(times[5:]) * 1e3,
            "host_cpu_ms": host_cpu / counted * 1e3,
            "nats_cpu_ms": per_start["cpu"] * 1e3,
            "nats_in": per_start["in"],
            "nats_out": per_start["out"],
            "node_sent": per_start["node_sent"],
            "node_got": per_start["node_got"],
        }


def settled_count(nats, quiet=0.3, limit=5.0):
    """The node's sent-message count once it has sent nothing for `quiet` s
    (a task's settlement and notices go out after task_output's wait
    answers)."""
    last, since, deadline = nats.node_sent(), time.time(), time.time() + limit
    while time.time() < deadline:
        time.sleep(0.05)
        now = nats.node_sent()
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= quiet:
            break
    return last


def round_trips(nats, count=20):
    """Where a start's NATS messages go: the messages the cluster node sends
    (publishes and requests, /connz) during the start call itself, and from
    its answer until the node is quiet again (the task's end: settlement and
    who-was-told). Not timed; a heartbeat (every 3.75 s) may fall into one
    window, so the medians are reported."""
    with Server("cluster", nats, "trips", OWNER) as server:
        in_start, in_end = [], []
        for i in range(count + 5):
            before = settled_count(nats)
            task_id = server.start("true")
            answered = nats.node_sent()
            server.call("task_output", {"task_id": task_id, "wait": True})
            if i >= 5:
                in_start.append(answered - before)
                in_end.append(settled_count(nats) - answered)
        return in_start, in_end, record_size(nats, task_id)


def reads(nats, rounds=3, count=200):
    """p50 of a consuming task_output read of a task on node r-a, asked on
    r-a itself (local) and on r-b (forwarded), alternating, same owner,
    each read taking the output printed since the one before."""
    with Server("cluster", nats, "reads-a", ["--owner", "bench"]) as a, \
            Server("cluster", nats, "reads-b", ["--owner", "bench"]) as b:
        task_id = a.start("while :; do echo line; sleep 0.001; done")
        # Measure once the task prints: before, a read answers "(no new
        # output)" from memory in a tenth of the time.
        deadline = time.time() + 30
        while "line\n" not in a.call("task_output", {"task_id": task_id})["content"][0]["text"]:
            if time.time() > deadline:
                raise SystemExit("the reads' task printed nothing in 30 s")
            time.sleep(0.01)
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


def main():
    root = tempfile.mkdtemp(prefix="cluster-bench-nats-")
    nats = None
    try:
        nats = Nats(root)
        nats.start()
        nats.wait_ready()
        results = {"sqlite": [], "cluster": []}
        for r in range(3):
            for store in ("sqlite", "cluster"):
                results[store].append(run(store, nats, r))
        for store, rounds in results.items():
            keys = ("p50_ms", "host_cpu_ms") if store == "sqlite" else rounds[0].keys()
            for key in keys:
                print(f"{store:8} {key:12}", [round(x[key], 2) for x in rounds])
        med = lambda store, key: statistics.median(x[key] for x in results[store])
        ratio = med("cluster", "p50_ms") / med("sqlite", "p50_ms")
        print("ratio cluster/sqlite start p50 (median of rounds): %.3f" % ratio)
        print("host CPU per start, cluster / sqlite (median of rounds): %.2f / %.2f ms"
              % (med("cluster", "host_cpu_ms"), med("sqlite", "host_cpu_ms")))
        per_start = (med("cluster", "host_cpu_ms") + med("cluster", "nats_cpu_ms")) / 1e3
        print("cluster CPU per start (host + NATS): %.2f ms -> %.0f starts/s per core"
              % (per_start * 1e3, 1 / per_start))
        print("NATS messages per start, the 3 servers in / out (replication, routes and beats included): %.1f / %.1f"
              % (med("cluster", "nats_in"), med("cluster", "nats_out")))
        print("NATS messages per start, sent by the node / sent to it: %.2f / %.2f"
              % (med("cluster", "node_sent"), med("cluster", "node_got")))
        in_start, in_end, size = round_trips(nats)
        print("node's messages during the start call:", in_start)
        print("node's messages from its answer to quiet (the end):", in_end)
        print("median: %s in the start, %s for the end"
              % (statistics.median(in_start), statistics.median(in_end)))
        if size is None:
            raise SystemExit("the last task's record was not found in the bucket")
        floors = floor(nats, size)
        print("floor: a bare client's create-only publish of %d bytes (a settled record's size), p50 ms per round:" % size,
              [round(x, 3) for x in floors])
        print("cluster - sqlite start p50 (median of rounds): %.2f ms; the floor's median: %.2f ms"
              % (med("cluster", "p50_ms") - med("sqlite", "p50_ms"), statistics.median(floors)))
        local, remote = reads(nats)
        print("consuming read p50 ms, local  per round:", [round(x, 3) for x in local])
        print("consuming read p50 ms, remote per round:", [round(x, 3) for x in remote])
        print("reads per second, remote / local (median of rounds): %.3f"
              % (statistics.median(local) / statistics.median(remote)))
    finally:
        if nats is not None:
            nats.stop()
        shutil.rmtree(root, ignore_errors=True)


main()
