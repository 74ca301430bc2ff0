--- bench/train_cpu.lua: training throughput on the CPU, lutra side by side
-- with PyTorch (Debian's python3-torch, bench/train_cpu_torch.py): the main
-- job's GPT-2 config (recipes/gpt2.lua's defaults), AdamW with clipping at
-- 1.0, the same initial weights (lutra's, saved and loaded by the others:
-- the step-0 losses must agree), the same batches of random tokens and the
-- same thread count. The sides are this lutra, lutra on 2 ranks under
-- mpirun (data parallel, the same global batch split in two), and PyTorch
-- under its default thread environment and under lutra's (OMP_WAIT_POLICY,
-- OPENBLAS_THREAD_TIMEOUT: host/app/main.c); they take turns a training step at
-- a time (bench/interleave.lua). Prints each side's median step over the
-- same rounds as tokens/s, lutra's speed over its, peak RSS (with loading
-- the initial weights), and the losses at step 0 and at the last step.
--
--   ./lutra bench/train_cpu.lua [--steps=20] [--n_layer=4] [--n_embd=128] [--seq=128] [--batch=4] [--quick]
--                               [--baseline=OTHER_LUTRA]
--
-- --baseline: one more side, another lutra binary (say one built from the
-- commit before a change) running this script's single-process trainer on
-- the same weights and batches: a before/after comparison in one run.
-- --quick: a tiny model for 3 steps (that the script runs: tests/lua/bench_spec.lua).
local lt = require "lutra"
local I = require "bench.interleave"

local cfg = lt.config { steps = 20, n_layer = 4, n_head = 4, n_embd = 128, seq = 128, batch = 4, vocab = 50257,
  quick = false, mpi = true, torch = true, peer = "", peer_ranks = 2, baseline = "",
  _help = { steps = "timed steps (rounds) after one warm-up step", quick = "a tiny model for 3 steps",
    mpi = "run the 2-rank side (mpirun)", torch = "run the PyTorch sides", peer = "(internal: the directory of a peer side's inputs)",
    peer_ranks = "(internal: the ranks of that side)", baseline = "another lutra binary to run as one more side" } }
if cfg.quick then
  cfg.steps, cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.seq, cfg.batch, cfg.vocab = 3, 1, 2, 32, 16, 2, 256
end

local function peak_rss()
  local f = io.open("/proc/self/status")
  if not f then return 0 end
  local text = f:read("*a")
  f:close()
  return (tonumber(text:match("VmHWM:%s*(%d+)")) or 0) * 1024
end

--- A lutra trainer from the saved weights and batches (in dir); world > 1:
-- data parallel, rank r takes its rows of each batch. step(i) -> seconds, loss
-- (the global batch's: the ranks' mean).
local function trainer(dir, world)
  local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
    block_size = cfg.seq, vocab_size = cfg.vocab }
  model:load_state_dict((lt.load(dir .. "/weights.safetensors")))
  local batches = lt.load(dir .. "/batches.safetensors")
  local xs, ys = batches.x, batches.y
  local ddp = world > 1 and lt.dist.DataParallel(model) or nil
  local opt = lt.optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
  local b = cfg.batch / world
  local row = lt.dist.rank() * b + 1
  return function(i)
    local x = xs:select(1, i + 1):narrow(1, row, b):contiguous()
    local y = ys:select(1, i + 1):narrow(1, row, b):contiguous()
    local t0 = lt.clock()
    local loss = model:loss(x, y)
    opt:zero_grad()
    -- DataParallel sums the ranks' gradients: each rank's mean over its rows / world
    -- makes the sum the global batch's mean (lt.dist.ddp)
    if ddp then (loss / world):backward() else loss:backward() end
    if ddp then ddp:finish() end
    lt.optim.clip_grad_norm(model, 1.0)
    opt:step()
    loss = loss:item()
    local secs = lt.clock() - t0
    if world > 1 then loss = lt.dist.all_reduce(lt.tensor { loss }, { op = "sum" }):item() / world end
    return secs, loss
  end, model
end

local _, world = lt.dist.init()
if cfg.peer ~= "" then -- the 2-rank side under mpirun, or a baseline lutra: bench/interleave.lua's peer protocol
  if world ~= cfg.peer_ranks then
    error(("train_cpu: the %d-rank side runs as %d ranks (this lutra built without MPI?)"):format(cfg.peer_ranks,
      cfg.peer_ranks), 0)
  end
  local step = trainer(cfg.peer, world)
  I.serve(function(cmd)
    if cmd == "rss" then return { peak_rss = peak_rss() } end
    local secs, loss = step(tonumber(cmd:match("^step (%d+)$")))
    return { seconds = secs, loss = loss }
  end, { threads = lt.num_threads(), ranks = world, env = I.lutra_env() })
  return
end

local threads = lt.num_threads()
local B, T, V = cfg.batch, cfg.seq, cfg.vocab
if B % 2 ~= 0 then cfg.mpi = false end -- (the 2-rank side splits the batch in two)

-- the initial weights (GPT-2's init from generator 0) and every step's batch, for all the sides
local dir = io.popen("mktemp -d"):read("*l")
do
  local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
    block_size = T, vocab_size = V, generator = lt.Generator(0) }
  lt.save(dir .. "/weights.safetensors", model:state_dict())
  local g = lt.Generator(1)
  lt.save(dir .. "/batches.safetensors", { x = lt.randint(0, V, { cfg.steps + 1, B, T }, { generator = g }),
    y = lt.randint(0, V, { cfg.steps + 1, B, T }, { generator = g }) })
end

print(("GPT-2 training on the CPU: %d layers, %d wide, T=%d, B=%d, V=%d, AdamW + clipping; the same weights and batches;")
  :format(cfg.n_layer, cfg.n_embd, T, B, V))
print(("median of %d interleaved steps after one warm-up step (step 0)"):format(cfg.steps))

local step, model = trainer(dir, 1)
local losses = { lutra = {} }
local sides = { { name = "lutra", run = function(i)
  local secs, loss = step(i)
  losses.lutra[i] = loss
  return secs
end } }
local described = { lutra = ("%d threads (%s)"):format(threads, I.describe_env()) }
local peers, missing = {}, {}
local function add(name, p, err, describe)
  if not p then
    missing[#missing + 1] = ("%-8s not run: %s"):format(name, err:gsub("\n", " | "))
    return
  end
  peers[name] = p
  losses[name] = {}
  described[name] = describe(p.info)
  sides[#sides + 1] = { name = name, run = function(i)
    local r = p:call("step " .. i)
    losses[name][i] = r.loss
    return r.seconds
  end }
end

-- this script's own arguments, for the peer sides that rerun it
local self_args = {}
for _, a in ipairs(arg) do self_args[#self_args + 1] = I.shell_quote(a) end
if cfg.mpi then
  local root = io.popen("id -u"):read("*l") == "0" and " --allow-run-as-root" or ""
  local p, err
  if io.popen("command -v mpirun"):read("*l") then
    p, err = I.peer { ranks = 2, cmd = ("mpirun -np 2 --oversubscribe%s ./lutra bench/train_cpu.lua %s --peer=%s")
      :format(root, table.concat(self_args, " "), I.shell_quote(dir)) }
  else
    err = "mpirun is not installed"
  end
  add("lutra x2", p, err, function(info)
    return ("%d ranks x %d thread(s), data parallel (%s); RSS of rank 0"):format(info.ranks, info.threads,
      I.describe_env(info.env))
  end)
end
if cfg.baseline ~= "" then
  local p, err = I.peer { cmd = ("%s bench/train_cpu.lua %s --peer=%s --peer_ranks=1"):format(
    I.shell_quote(cfg.baseline), table.concat(self_args, " "), I.shell_quote(dir)) }
  add("baseline", p, err, function(info)
    return ("%s: %d threads (%s)"):format(cfg.baseline, info.threads, I.describe_env(info.env))
  end)
end
local torch_args = ("%s %s %d %d %d %d %d %d"):format(I.shell_quote(dir .. "/weights.safetensors"),
  I.shell_quote(dir .. "/batches.safetensors"), cfg.n_layer, cfg.n_head, cfg.n_embd, V, T, threads)
for _, e in ipairs(cfg.torch and { { "torch", "default", I.default_env }, { "torch*", "lutra's", I.lutra_env() } } or {}) do
  local p, err = I.peer { env = e[3], cmd = "/usr/bin/python3 bench/train_cpu_torch.py " .. torch_args }
  add(e[1], p, err, function(info)
    return ("torch %s, %s env: %d threads, %d inter-op (%s)"):format(info.torch, e[2], info.threads, info.interop,
      I.describe_env(info.env))
  end)
end

local r = I.rounds(cfg.steps, sides)
local rss = { lutra = peak_rss() }
for name, p in pairs(peers) do
  rss[name] = p:call("rss").peak_rss
  p:close()
end
os.execute("rm -rf " .. I.shell_quote(dir))

print(("%-8s %10s %7s %9s %12s %10s  %s"):format("runtime", "tokens/s", "lutra/x", "peak RSS", "step-0 loss",
  "last loss", "threads"))
for _, s in ipairs(sides) do
  local name = s.name
  print(("%-8s %10.0f %7.2f %5.0f MiB %12.4f %10.4f  %s"):format(name, B * T / r.median[name],
    r:ratio(name, "lutra"), rss[name] / 2 ^ 20, losses[name][0], losses[name][cfg.steps], described[name]))
end
for _, line in ipairs(missing) do print(line) end
print(("lutra/x: lutra's tokens/s over that side's (its median step time over lutra's, the same rounds); %d parameters")
  :format(model:num_parameters()))
print("torch: PyTorch under its default thread environment; torch*: under lutra's")
