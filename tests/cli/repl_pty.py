#!/usr/bin/env python3
"""tests/cli/repl_pty.py: drives `lutra` on a pseudo-terminal, as a person at
a keyboard would, and prints TAP: prompts, values printed, multi-line input,
errors that keep the REPL alive, TAB completion (lt.ze<TAB> -> lt.zeros),
Ctrl-C during a call, during one long op (it stops when the op returns) and
at the prompt, history in ~/.lutra_history, and
Ctrl-D leaving with status 0.

    python3 tests/cli/repl_pty.py ./lutra
"""
import os
import pty
import re
import select
import signal
import sys
import tempfile
import time

LUTRA = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "./lutra")
results = []
timeouts = []


def check(name, ok, detail=""):
    results.append((name, ok, detail))


class Session:
    def __init__(self, home):
        env = dict(os.environ, HOME=home, TERM="xterm")
        env.pop("LUTRA_PATH", None)
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(LUTRA, [LUTRA], env)
        self.buf = ""

    def read_until(self, pattern, timeout=10.0):
        """Reads output until the regex matches what came since the last read;
        returns that text (or None on timeout)."""
        end = time.time() + timeout
        while time.time() < end:
            m = re.search(pattern, self.buf, re.S)
            if m:
                out, self.buf = self.buf[:m.end()], self.buf[m.end():]
                return out
            r, _, _ = select.select([self.fd], [], [], 0.1)
            if r:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    break
                if not data:
                    break
                self.buf += data.decode("utf-8", "replace")
        # (kept for the report: what the terminal showed while nothing matched)
        timeouts.append("waited %.0f s for %r; the terminal showed %r" % (timeout, pattern, self.buf[-300:]))
        return None

    def send(self, text):
        os.write(self.fd, text.encode())

    def close(self):
        try:
            self.send("\x04")
        except OSError:
            pass
        deadline = time.time() + 15  # generous: CI machines can be slow
        while time.time() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None


PROMPT = r"(?m)^> $|> $"

with tempfile.TemporaryDirectory() as home:
    s = Session(home)
    banner = s.read_until(PROMPT)
    check("banner and prompt", banner is not None and "lutra" in banner, repr(banner))

    s.send("1 + 1\r")
    out = s.read_until(PROMPT)
    check("an expression's value is printed", out is not None and re.search(r"\b2\b", out), repr(out))

    s.send("x = lt.ones(2, 3)\r")
    s.read_until(PROMPT)
    s.send("x:sum()\r")
    out = s.read_until(PROMPT)
    check("tensors print as summaries with shape and dtype",
          out is not None and "shape=[]" in out and "6.0000" in out, repr(out))

    s.send("lt.zeros(2000, 2000)\r")
    out = s.read_until(PROMPT)
    check("a large tensor prints its edges only",
          out is not None and "..." in out and len(out) < 2000, repr(out)[:300])

    s.send("for i = 1, 2 do\r")
    cont = s.read_until(r">> $")
    s.send("print('line', i)\r")
    s.read_until(r">> $")
    s.send("end\r")
    out = s.read_until(PROMPT)
    check("an incomplete statement asks for more lines",
          cont is not None and out is not None and "line\t1" in out and "line\t2" in out, repr(out))

    s.send("error('boom')\r")
    out = s.read_until(PROMPT)
    check("an error is shown with a traceback and the REPL goes on",
          out is not None and "boom" in out and "traceback" in out, repr(out))

    s.send("lt.matmul(lt.zeros{2,3}, lt.zeros{4,5})\r")
    out = s.read_until(PROMPT)
    check("a failing op names the op and shapes", out is not None and "matmul" in out and "[2, 3]" in out,
          repr(out))

    s.send("lt.ze\t")
    echo = s.read_until(r"ros", timeout=5)  # the terminal shows the added letters
    s.send("\r")
    out = s.read_until(PROMPT)
    # lt.zeros and lt.zeros_like share "lt.zeros": the line runs as lt.zeros, a function
    check("TAB completes lt.ze to lt.zeros", echo is not None and out is not None and "function" in out,
          repr(echo) + repr(out))

    s.send("x:resh\t")
    echo = s.read_until(r"ape", timeout=5)
    s.send("(3, 2):size(1)\r")
    out = s.read_until(PROMPT)
    check("TAB completes tensor methods after ':'", echo is not None and out is not None and "3" in out,
          repr(echo) + repr(out))

    s.send("local t = lt.zeros{1}; while true do t = t + 1 end\r")
    time.sleep(1.0)
    s.send("\x03")
    out = s.read_until(PROMPT, timeout=10)
    check("Ctrl-C interrupts a running call and returns to the prompt",
          out is not None and "interrupted!" in out, repr(out))
    s.send("print('still here')\r")
    out = s.read_until(PROMPT)
    check("the REPL works after an interrupt", out is not None and "still here" in out, repr(out))

    # one long op (a 6500 x 6500 product on one thread: 4 s or more): Ctrl-C
    # says it stops when the op returns, and it does, keeping the session
    s.send("lt.set_num_threads(1) a = lt.randn(6500, 6500) kept = 42\r")
    s.read_until(PROMPT, timeout=30)
    s.send("c = lt.matmul(a, a)\r")
    time.sleep(0.5)
    s.send("\x03")
    out = s.read_until(PROMPT, timeout=60)
    check("Ctrl-C during one long op says it stops when the op returns",
          out is not None and "stopping when matmul returns" in out and "compiled Lua loop" not in out, repr(out))
    check("... and stops there, back at the prompt", out is not None and "interrupted!" in out, repr(out))
    s.send("print(kept, c)\r")
    out = s.read_until(PROMPT)
    check("the session is kept after an op is interrupted", out is not None and "42\tnil" in out, repr(out))
    s.send("a = nil collectgarbage()\r")
    s.read_until(PROMPT)

    s.send("local s = 0 for i = 1, 1e12 do s = s + i end\r")
    time.sleep(0.5)
    s.send("\x03")
    out = s.read_until(r"cannot stop", timeout=6)
    check("a compiled loop that Ctrl-C cannot stop is explained", out is not None, repr(out))
    s.send("\x03")
    time.sleep(0.5)
    code = s.close()
    check("a second Ctrl-C ends lutra", code == -2, repr(code))
    s = Session(home)
    s.read_until(PROMPT)

    s.send("this line is dropped")
    time.sleep(0.3)
    s.send("\x03")
    out = s.read_until(PROMPT, timeout=5)
    s.send("print('fresh')\r")
    out2 = s.read_until(PROMPT)
    check("Ctrl-C at the prompt discards the line",
          out is not None and out2 is not None and "fresh" in out2 and "dropped" not in out2, repr(out2))

    code = s.close()
    check("Ctrl-D leaves with status 0", code == 0, repr(code))
    hist = os.path.join(home, ".lutra_history")
    text = open(hist).read() if os.path.exists(hist) else ""
    check("history is kept in ~/.lutra_history", "x:sum()" in text, repr(text[:200]))

    # history comes back in a new session: up-arrow recalls the last entry
    s = Session(home)
    s.read_until(PROMPT)
    s.send("\x1b[A\r")
    out = s.read_until(PROMPT)
    check("history is read back (up arrow)", out is not None and "fresh" in out, repr(out))
    s.close()

for i, (name, ok, detail) in enumerate(results, 1):
    print(f"{'ok' if ok else 'not ok'} {i} - {name}")
    if not ok:
        print(f"# {detail}")
        for t in timeouts:  # a failure after a read that timed out: say what was on the screen
            print(f"# {t}")
print(f"1..{len(results)}")
