"""Start `tiler view` on a free port and learn which: the one way view_test.py and bench.py start the server."""
import re
import subprocess


def start_view(tiler, out, *flags, cwd=None):
    """`TILER view OUT --port 0 FLAGS`: the running server, its port, and what it printed up to its URL."""
    server = subprocess.Popen([str(tiler), "view", str(out), "--port", "0", *map(str, flags)], cwd=cwd,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in server.stdout:
        lines.append(line)
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        if m:
            return server, int(m.group(1)), "".join(lines)
    server.kill()
    server.wait()
    raise RuntimeError("tiler view printed no URL: " + "".join(lines))


def stop_view(server):
    """Stop a server start_view started and release its pipe."""
    server.kill()
    server.wait()
    server.stdout.close()
