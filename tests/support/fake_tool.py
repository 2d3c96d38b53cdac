"""A stand-in for gcluster/gcloud in tests. Copied into a test's bin/ folder with a spec beside it.

``spec.json`` (next to this file) holds ``{"responses": [{"match": [...], "steps": [...],
"exit": N}, ...]}``: the first response whose ``match`` words all appear in argv (in order) is used;
a response with a ``sequence`` list uses its entries one per call (the last repeats). Steps:
``["out", text]`` / ``["err", text]`` print a line, ``["file", path]`` prints a file's lines,
``["env", NAME]`` prints ``NAME=value``, ``["prompt"]`` reads a line from stdin and fails like
gcluster's prompt on EOF, ``["stdin"]`` reads all stdin (recorded) and echoes it, ``["wait_for",
path]`` waits for a file to appear (handshake; bounded), ``["sleep", s]``, ``["spawn_child"]``
starts a long-lived child and writes its pid to child.pid, ``["write_home", name, text]`` /
``["cat_home", name]`` write/read a file under $HOME. Each call is appended to calls.jsonl.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _matches(words, argv):
    pos = 0
    for word in words:
        try:
            pos = argv.index(word, pos) + 1
        except ValueError:
            return False
    return True


def _pick(spec, argv):
    for index, response in enumerate(spec["responses"]):
        if _matches(response.get("match", []), argv):
            if "sequence" not in response:
                return response
            counter = HERE / f"seq-{index}.count"
            n = int(counter.read_text()) if counter.exists() else 0
            counter.write_text(str(n + 1))
            return response["sequence"][min(n, len(response["sequence"]) - 1)]
    return {"steps": [["err", "fake: no response for " + " ".join(argv)]], "exit": 2}


def main():
    argv = sys.argv[1:]
    spec = json.loads((HERE / "spec.json").read_text())
    response = _pick(spec, argv)
    record = {"tool": Path(sys.argv[0]).name, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
    for step in response.get("steps", []):
        kind = step[0]
        if kind == "out":
            print(step[1], flush=True)
        elif kind == "err":
            print(step[1], file=sys.stderr, flush=True)
        elif kind == "file":
            for line in Path(step[1]).read_text().splitlines():
                print(line, flush=True)
        elif kind == "env":
            print(f"{step[1]}={os.environ.get(step[1], '')}", flush=True)
        elif kind == "prompt":
            print("Do you want to continue? [y/N]: ", flush=True)
            answer = sys.stdin.readline()
            if not answer:
                print("Error: EOF", file=sys.stderr, flush=True)
                record["prompt"] = "eof"
                break
            record["prompt"] = answer
        elif kind == "stdin":
            data = sys.stdin.read()
            record["stdin"] = data
            print(f"received token={data}", flush=True)
        elif kind == "wait_for":
            target = Path(step[1])
            for _ in range(400):
                if target.exists():
                    print("handshake ok", flush=True)
                    break
                time.sleep(0.025)
            else:
                print("handshake missing", flush=True)
        elif kind == "sleep":
            time.sleep(float(step[1]))
        elif kind == "spawn_child":
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            (HERE / "child.pid").write_text(str(child.pid))
            print("child started", flush=True)
        elif kind == "write_home":
            target = Path(os.environ["HOME"]) / step[1]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step[2])
        elif kind == "cat_home":
            target = Path(os.environ["HOME"]) / step[1]
            print(target.read_text() if target.exists() else "missing", flush=True)
    with open(HERE / "calls.jsonl", "a") as calls:
        calls.write(json.dumps(record) + "\n")
    sys.exit(int(response.get("exit", 0)))


if __name__ == "__main__":
    main()
