#!/usr/bin/env bash
# glm53 run / chat end to end on the random fixture checkpoint (written by the
# test_generate unit-test binary built next to glm53):
#  1. run: greedy output is reproducible, --stop cuts it, errors are one line;
#  2. chat over a pipe: continuing the cache between turns gives the same
#     greedy replies as re-prefilling the whole conversation every turn;
#  3. chat on a pseudo-terminal (python3 pty): a reply, /reset, Ctrl-C during
#     a long generation (the program stays alive and answers again), Ctrl-C
#     at the prompt, /quit -> exit 0.
# Usage: bash tests/integration/test_chat_pty.sh /path/to/glm53
set -euo pipefail
BIN=${1:?usage: $0 /path/to/glm53}
FIX="$(dirname "$BIN")/test_generate"
[ -x "$FIX" ] || { echo "FAIL: fixture writer $FIX not built"; exit 1; }
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 0; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
M="$TMP/model"
"$FIX" --write-model-dir "$M"
export OMP_NUM_THREADS=1 GLM53_LOG=error
fail() { echo "FAIL: $*"; exit 1; }

# ---- 1. run ----
"$BIN" run --model "$M" -p "Hello there" --temperature 0 --max-tokens 24 --ignore-eos >"$TMP/a" 2>"$TMP/a.err"
"$BIN" run --model "$M" -p "Hello there" --temperature 0 --max-tokens 24 --ignore-eos >"$TMP/b" 2>/dev/null
cmp -s "$TMP/a" "$TMP/b" || fail "greedy run not reproducible"
grep -q "generated 24 tokens" "$TMP/a.err" || fail "stats line: $(cat "$TMP/a.err")"
grep -q "finish: length" "$TMP/a.err" || fail "finish reason: $(cat "$TMP/a.err")"
# a stop string taken from the output: what is printed is the text before it
python3 - "$TMP/a" "$M" "$BIN" <<'EOF'
import subprocess, sys
out = open(sys.argv[1], 'rb').read()[:-1]          # run adds one newline
stop = None
for i in range(4, len(out) - 2):                     # 2 printable ASCII bytes
    s = out[i:i + 2]
    if all(0x21 <= c < 0x7f for c in s):
        stop = s
        break
if stop is None:
    print("note: no printable pair in the greedy output, stop check skipped"); sys.exit(0)
r = subprocess.run([sys.argv[3], "run", "--model", sys.argv[2], "-p", "Hello there", "--temperature", "0",
                    "--max-tokens", "24", "--ignore-eos", "--stop", stop.decode()], capture_output=True)
want = out[:out.index(stop)] + b"\n"
assert r.returncode == 0, r.stderr
assert r.stdout == want, (r.stdout, want)
assert b"finish: stop" in r.stderr, r.stderr
EOF
if "$BIN" run --model "$M" -p "Hello there" --ctx 4 >/dev/null 2>"$TMP/e"; then fail "prompt longer than --ctx accepted"; fi
grep -q "prompt too long" "$TMP/e" || fail "prompt-too-long message: $(cat "$TMP/e")"
if "$BIN" run --model "$TMP/none" -p x >/dev/null 2>"$TMP/e"; then fail "missing model accepted"; fi
[ "$(wc -l <"$TMP/e")" -eq 1 ] || fail "missing model: expected one error line, got: $(cat "$TMP/e")"

# ---- 2. chat over a pipe: cache reuse == full re-prefill ----
printf 'hi\nmore please\nthird one\n' |
  GLM53_CHAT_NO_REUSE=0 "$BIN" chat --model "$M" --temperature 0 --max-tokens 6 >"$TMP/c1" 2>/dev/null
printf 'hi\nmore please\nthird one\n' |
  GLM53_CHAT_NO_REUSE=1 "$BIN" chat --model "$M" --temperature 0 --max-tokens 6 >"$TMP/c2" 2>/dev/null
cmp -s "$TMP/c1" "$TMP/c2" || fail "chat replies differ between cache reuse and re-prefill"
[ "$(grep -c '\[reasoning\]' "$TMP/c1")" -eq 3 ] || fail "expected 3 replies: $(cat -v "$TMP/c1")"

# ---- 3. chat on a pseudo-terminal ----
python3 - "$BIN" "$M" <<'EOF'
import os, pty, re, select, signal, sys, time
binp, model = sys.argv[1], sys.argv[2]
pid, fd = pty.fork()
if pid == 0:
    os.execv(binp, [binp, "chat", "--model", model, "--max-tokens", "40", "--ignore-eos",
                    "--ctx", "60000", "--seed", "5"])
buf = b""
def read_some(timeout):
    global buf
    r, _, _ = select.select([fd], [], [], timeout)
    if r:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        buf += data
        return len(data)
    return 0
def wait_for(pattern, start, timeout=60):
    end = time.time() + timeout
    rx = re.compile(pattern, re.S)
    while time.time() < end:
        m = rx.search(buf, start)
        if m:
            return m.end()
        read_some(0.05)
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            sys.exit("FAIL: glm53 chat exited early; output: %r" % buf[-500:])
    sys.exit("FAIL: timeout waiting for %r; output tail: %r" % (pattern, buf[-500:]))
def send(s):
    os.write(fd, s)
PROMPT = rb">>> "
pos = wait_for(PROMPT, 0)
send(b"hello\n")
pos = wait_for(rb"\[stopped: token limit or context end\]\r?\n" + PROMPT, pos)
send(b"/reset\n")
pos = wait_for(rb"\(conversation cleared\)\r?\n" + PROMPT, pos)
send(b"/set max-tokens 0\n")
pos = wait_for(PROMPT, pos)
send(b"tell me a very long story\n")
mark = len(buf)
end = time.time() + 30
while len(buf) - mark < 300 and time.time() < end:   # the reply is streaming
    read_some(0.05)
assert len(buf) - mark >= 300, "no streamed output: %r" % buf[-300:]
send(b"\x03")                                          # Ctrl-C: SIGINT via the tty
pos = wait_for(rb"\[interrupted\]\r?\n" + PROMPT, mark, timeout=30)
assert os.waitpid(pid, os.WNOHANG) == (0, 0), "chat died on Ctrl-C"
send(b"/set max-tokens 3\n")
pos = wait_for(PROMPT, pos)
send(b"still there?\n")                                # the session works after an interrupt
pos = wait_for(rb"\[stopped: token limit or context end\]\r?\n" + PROMPT, pos)
send(b"\x03")                                          # Ctrl-C at the prompt: a hint, not an exit
pos = wait_for(rb"Ctrl-C again", pos)
pos = wait_for(PROMPT, pos)
send(b"/quit\n")
end = time.time() + 20
while time.time() < end:
    read_some(0.05)
    wp, status = os.waitpid(pid, os.WNOHANG)
    if wp:
        break
else:
    os.kill(pid, signal.SIGKILL)
    sys.exit("FAIL: chat did not exit after /quit")
if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
    sys.exit("FAIL: chat exit status %r" % status)
print("pty chat ok")
EOF
echo "PASS"
