--- bench/interleave.lua: side-by-side timing for the benchmarks. The sides
-- of a comparison run alternately (A B A B ..., each side once a round, for
-- at least 3 rounds after one warm-up round), so that a change in the
-- machine's load falls on all of them; medians and ratios are taken over the
-- same rounds. A side is a Lua function (lutra, in this process) or a
-- command to a peer process that this module starts and drives one line at
-- a time (PyTorch, tiktoken, lutra under mpirun).
--
--   local I = require "bench.interleave"
--   local torch = I.peer { cmd = "/usr/bin/python3 bench/x_torch.py ...", env = I.default_env }
--   print(torch.info.threads)              -- the peer's first line (its hello), decoded
--   local r = I.rounds(5, {
--     { name = "lutra", run = function() local t0 = lt.clock(); step(); return lt.clock() - t0 end },
--     { name = "torch", run = function() return torch:call("step").seconds end },
--   })
--   print(r.median.lutra, r.median.torch, r:ratio("torch", "lutra"))  -- torch's time / lutra's
--   torch:close()
--
-- A peer's protocol: the module makes a FIFO per rank, <dir>/cmd.<rank>, and
-- starts the command in the background with LUTRA_BENCH_CMD=<dir>/cmd in its
-- environment and its standard output into another FIFO. The peer opens
-- $LUTRA_BENCH_CMD.<rank> (rank 0 unless it runs under mpirun), prints one
-- JSON line (its hello), then for each command line it reads prints one
-- JSON line (rank 0 only), flushed; it exits at "quit" or at the end of the
-- FIFO (this process gone, even by an error: no peer outlives it). I.serve
-- is the Lua side of that, bench/interleave.py the Python side.
local lt = require "lutra"

local M = {}

--- The variables of the threads' environment that lutra sets for itself
-- (host/app/main.c: passive OpenMP waiting, OpenBLAS's shortest spin) and that a
-- peer started from lutra would inherit.
M.THREAD_VARS = { "OMP_WAIT_POLICY", "OPENBLAS_THREAD_TIMEOUT" }

--- A peer's own defaults: the thread variables unset (env for I.peer).
M.default_env = { OMP_WAIT_POLICY = false, OPENBLAS_THREAD_TIMEOUT = false }

--- The thread variables as this lutra runs with them (env for I.peer).
function M.lutra_env()
  local env = {}
  for _, k in ipairs(M.THREAD_VARS) do env[k] = os.getenv(k) or false end
  return env
end

--- "OMP_WAIT_POLICY=PASSIVE OPENBLAS_THREAD_TIMEOUT=4" for an env table
-- (false: "NAME unset"); nil describes this process's own.
function M.describe_env(env)
  env = env or M.lutra_env()
  local parts = {}
  for _, k in ipairs(M.THREAD_VARS) do
    local v = env[k] -- (a peer's JSON null is not a string)
    parts[#parts + 1] = type(v) == "string" and (k .. "=" .. v) or (k .. " unset")
  end
  return table.concat(parts, " ")
end

local function shell_quote(s) return "'" .. tostring(s):gsub("'", "'\\''") .. "'" end
M.shell_quote = shell_quote

local function run_out(cmd)
  local p = io.popen(cmd)
  local out = p:read("*a")
  p:close()
  return out
end

local function tail(path, n)
  local f = io.open(path)
  if not f then return "" end
  local lines = {}
  for l in f:lines() do lines[#lines + 1] = l end
  f:close()
  return table.concat(lines, "\n", math.max(1, #lines - (n or 8) + 1))
end

local Peer = {}
Peer.__index = Peer

--- I.peer{cmd = shell command, env = {NAME = value | false}, ranks = 1}
-- -> a started peer (its hello decoded in peer.info), or nil and a message
-- (the command failed before its hello: not installed, an error; the
-- message ends with its stderr's last lines). env's false unsets a
-- variable; ranks > 1 makes a FIFO for each rank (a command under mpirun).
function M.peer(o)
  local dir = run_out("mktemp -d"):gsub("%s+$", "")
  local ranks = o.ranks or 1
  local fifos = {}
  for r = 0, ranks - 1 do
    local path = ("%s/cmd.%d"):format(dir, r)
    local st = os.execute("mkfifo " .. shell_quote(path))
    assert(st == 0 or st == true, "interleave: mkfifo failed in " .. dir)
    -- read-write: opening does not wait for a reader (the peer opens it when it has started);
    -- "e": close-on-exec, so that no peer holds another's (or its own) FIFO open
    fifos[#fifos + 1] = { path = path, f = assert(io.open(path, "r+e")) }
  end
  local unset, set = {}, { "LUTRA_BENCH_CMD=" .. shell_quote(dir .. "/cmd") }
  for k, v in pairs(o.env or {}) do
    if v then set[#set + 1] = k .. "=" .. shell_quote(v) else unset[#unset + 1] = "-u " .. k end
  end
  local env = "env " .. table.concat(unset, " ") .. " " .. table.concat(set, " ")
  local err, out = dir .. "/stderr", dir .. "/out"
  local st = os.execute("mkfifo " .. shell_quote(out))
  assert(st == 0 or st == true, "interleave: mkfifo failed in " .. dir)
  local self = setmetatable({ dir = dir, fifos = fifos, err = err, cmd = o.cmd }, Peer)
  -- in the background, its output into a FIFO (not io.popen: at exit, a
  -- pclose would wait for a peer that waits for this process's commands)
  os.execute(("%s %s </dev/null >%s 2>%s &"):format(env, o.cmd, shell_quote(out), shell_quote(err)))
  self.p = assert(io.open(out, "re")) -- (returns when the shell above has opened it)
  local line = self.p:read("*l")
  local ok, info = pcall(lt.json.decode, line or "")
  if not ok or type(info) ~= "table" then
    local msg = tail(err)
    self:close()
    return nil, (line and ("its first line is not JSON: " .. line .. "\n") or "") .. msg
  end
  self.info = info
  -- every rank has its FIFO open now (the hello comes after that: I.serve,
  -- bench/interleave.py): from here this process holds the only writer, so
  -- a peer sees the end of its FIFO if this process dies
  for _, fi in ipairs(fifos) do
    local w = assert(io.open(fi.path, "we"))
    fi.f:close()
    fi.f = w
  end
  return self
end

--- peer:call(command) -> the peer's reply line, decoded (an error with its
-- stderr's last lines if it died).
function Peer:call(cmd)
  for _, fi in ipairs(self.fifos) do
    fi.f:write(cmd, "\n")
    fi.f:flush()
  end
  local line = self.p:read("*l")
  local ok, r = pcall(lt.json.decode, line or "")
  if not ok or type(r) ~= "table" then
    error(("interleave: the peer `%s` gave no reply to %q:\n%s%s"):format(self.cmd, cmd,
      line and (line .. "\n") or "", tail(self.err)), 2)
  end
  return r
end

--- peer:close(): asks it to quit, waits for it to end (the end of its
-- output) and removes its FIFOs.
function Peer:close()
  if self.closed then return end
  self.closed = true
  for _, fi in ipairs(self.fifos) do
    pcall(function()
      fi.f:write("quit\n")
      fi.f:close()
    end)
  end
  self.p:read("*a")
  self.p:close()
  os.execute("rm -rf " .. shell_quote(self.dir))
end

local function median(t)
  local s = {}
  for i, v in ipairs(t) do s[i] = v end
  table.sort(s)
  local n = #s
  if n % 2 == 1 then return s[(n + 1) / 2] end
  return (s[n / 2] + s[n / 2 + 1]) / 2
end
M.median = median

local Result = {}
Result.__index = Result

--- r:ratio(a, b) -> median[a] / median[b], both over the same rounds.
function Result:ratio(a, b) return self.median[a] / self.median[b] end

--- r:round_ratio(a, b) -> the median of the rounds' a / b.
function Result:round_ratio(a, b)
  local q = {}
  for i = 1, self.n do q[i] = self.times[a][i] / self.times[b][i] end
  return median(q)
end

--- I.rounds(n, sides[, {warmup = 1}]) -> result: runs the sides in turn, each
-- side's run(round) once a round (round 0 .. warmup - 1 untimed, then n
-- timed rounds, n >= 3); run returns the seconds it measured. The result
-- has times[name] (seconds per timed round, in order), median[name], n,
-- and :ratio(a, b), :round_ratio(a, b).
function M.rounds(n, sides, o)
  o = o or {}
  if n < 3 then error(("interleave.rounds: %d rounds; a median needs at least 3"):format(n), 2) end
  local warm = o.warmup or 1
  local r = setmetatable({ n = n, times = {}, median = {}, names = {} }, Result)
  for i, s in ipairs(sides) do
    r.times[s.name] = {}
    r.names[i] = s.name
  end
  for round = 0, warm + n - 1 do
    for _, s in ipairs(sides) do
      local secs = s.run(round)
      if round >= warm then table.insert(r.times[s.name], secs) end
    end
  end
  for _, s in ipairs(sides) do r.median[s.name] = median(r.times[s.name]) end
  return r
end

--- I.serve(handler, hello): the loop of a Lua peer (a script that I.peer
-- started, under mpirun or not): opens its FIFO, prints hello (a table,
-- as JSON; after a barrier when there are several ranks, so that all have
-- theirs open), then for each command line prints handler(line)'s table;
-- rank 0 prints, every rank runs the handler. Returns at "quit" or the end.
function M.serve(handler, hello)
  local rank, world = lt.dist.rank(), lt.dist.world_size()
  local base = os.getenv("LUTRA_BENCH_CMD") or error("interleave.serve: LUTRA_BENCH_CMD is not set", 2)
  local f = assert(io.open(("%s.%d"):format(base, rank), "re"))
  if world > 1 then lt.dist.barrier() end
  local function emit(t)
    if rank == 0 then
      io.stdout:write(lt.json.encode(t), "\n")
      io.stdout:flush()
    end
  end
  emit(hello)
  for line in f:lines() do
    if line == "quit" then break end
    emit(handler(line))
  end
  f:close()
end

return M
