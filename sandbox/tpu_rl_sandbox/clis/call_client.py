"""The ``<root>/bin/gcloud`` and ``gcluster`` shims' client: hands the call to the sandbox's call
server, or runs it.

Run by path with ``python -S`` (no site, so it starts in about 10 ms) as ``call_client.py SOCKET
TOOL MODULE ARGS...``: it sends the call (tool, arguments, environment, working folder, umask) and
its own stdin, stdout and stderr to the call server listening on the abstract Unix socket
``SOCKET`` (:mod:`tpu_rl_sandbox.clis.call_server`), waits, and exits as the call did. When no
server answers it runs the fake itself: ``python -m MODULE ARGS...``, exactly what the shim ran
before the server existed. (The shim runs the calls the server never takes that way itself:
``call_server.shim_command``.)

Imports only modules the interpreter has built in (``_socket``, not ``socket``, whose Python layer
would double the client's start-up): nothing of this package.
"""

import _socket
import marshal
import os
import sys


def run_directly(module: str, args: list[str]) -> None:
    """``python -m MODULE ARGS`` in this process (the site loaded, as the shim's interpreter had it)."""
    os.execv(sys.executable, [sys.executable, "-m", module, *args])  # noqa: S606  (an argv, no shell)


def receive_exactly(sock: _socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main() -> None:
    name, tool, module, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.connect("\0" + name)
        mask = os.umask(0)
        os.umask(mask)
        payload = marshal.dumps((tool, args, dict(os.environ), os.getcwd(), mask))
        fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))  # SCM_RIGHTS: C ints
        data = len(payload).to_bytes(8, "big") + payload
        sent = sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
        if sent < len(data):
            sock.sendall(data[sent:])
    except OSError:
        sock.close()
        run_directly(module, args)
    reply = receive_exactly(sock, 2)
    if len(reply) != 2:
        sys.stderr.write(f"tpu-rl-sandbox: the call server of {module} stopped during the call\n")
        os._exit(1)
    kind, value = reply[0], reply[1]
    if kind == 1:  # the call was ended by signal ``value``: end this process the same way
        import signal

        signal.signal(value, signal.SIG_DFL)
        os.kill(os.getpid(), value)
        os._exit(128 + value)
    os._exit(value)


main()
