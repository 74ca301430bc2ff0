--- bench/train_cpu.lua: training throughput on the CPU, lutra next to
-- PyTorch (Debian's python3-torch, bench/train_cpu_torch.py) in the same
-- run: the main job's GPT-2 config (recipes/gpt2.lua's defaults), the same
-- batch, steps and thread count, AdamW with clipping at 1.0 on random
-- tokens. Prints tokens/s for both (steps after the first), their ratio and
-- peak RSS for both, and lutra on 2 ranks under mpirun (data parallel,
-- the same global batch split in two).
--
--   ./lutra bench/train_cpu.lua [--steps=20] [--n_layer=4] [--n_embd=128] [--seq=128] [--batch=4]
local lt = require "lutra"

local cfg = lt.config { steps = 20, n_layer = 4, n_head = 4, n_embd = 128, seq = 128, batch = 4, vocab = 50257 }
local threads = lt.num_threads()

local function peak_rss()
  local f = io.open("/proc/self/status")
  if not f then return 0 end
  local text = f:read("*a")
  f:close()
  return (tonumber(text:match("VmHWM:%s*(%d+)")) or 0) * 1024
end

-- world > 1 (under mpirun): data parallel, each rank batch / world of the global batch
local function bench_lutra(world)
  world = world or 1
  local model = lt.models.gpt2 { n_layer = cfg.n_layer, n_head = cfg.n_head, n_embd = cfg.n_embd,
    block_size = cfg.seq, vocab_size = cfg.vocab, generator = lt.Generator(0) }
  local ddp = world > 1 and lt.dist.DataParallel(model) or nil
  local opt = lt.optim.AdamW(model, { lr = 1e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 })
  local g = lt.Generator(1 + lt.dist.rank())
  local b = math.max(1, math.floor(cfg.batch / world))
  local t_first
  local loss
  for step = 0, cfg.steps do
    local x = lt.randint(0, cfg.vocab, { b, cfg.seq }, { generator = g })
    local y = lt.randint(0, cfg.vocab, { b, cfg.seq }, { generator = g })
    loss = model:loss(x, y)
    opt:zero_grad()
    loss:backward()
    if ddp then ddp:finish() end
    lt.optim.clip_grad_norm(model, 1.0)
    opt:step()
    loss = loss:item()
    if step == 0 then t_first = lt.clock() end
  end
  local dt = lt.clock() - t_first
  return { tokens_per_s = cfg.steps * b * world * cfg.seq / dt, peak_rss = peak_rss(), loss = loss,
    params = model:num_parameters() }
end

local rank, world = lt.dist.init()
if world > 1 then -- the child job of the 2-rank line: rank 0 reports
  local r = bench_lutra(world)
  if rank == 0 then print(lt.json.encode(r)) end
  return
end

local function bench_torch()
  local cmd = ("/usr/bin/python3 bench/train_cpu_torch.py %d %d %d %d %d %d %d %d %d 2>/dev/null"):format(cfg.n_layer,
    cfg.n_head, cfg.n_embd, cfg.vocab, cfg.seq, cfg.batch, cfg.seq, threads, cfg.steps)
  local p = io.popen(cmd)
  local out = p and p:read("*a") or ""
  if p then p:close() end
  local ok, res = pcall(lt.json.decode, out:match("{.*}") or "")
  return ok and res or nil
end

print(("GPT-2 training on the CPU: %d layers, %d wide, T=%d, B=%d, %d threads, AdamW + clipping, %d steps after one warm-up")
  :format(cfg.n_layer, cfg.n_embd, cfg.seq, cfg.batch, threads, cfg.steps))
local l = bench_lutra()
print(("%-8s %12s %12s %10s"):format("runtime", "tokens/s", "peak RSS", "last loss"))
print(("%-8s %12.0f %9.0f MiB %10.4f"):format("lutra", l.tokens_per_s, l.peak_rss / 2 ^ 20, l.loss))
do
  local self_args = {}
  for _, a in ipairs(arg) do self_args[#self_args + 1] = "'" .. a:gsub("'", "'\\''") .. "'" end
  local root = io.popen("id -u"):read("*l") == "0" and " --allow-run-as-root" or ""
  local p = io.popen(("mpirun -np 2 --oversubscribe%s ./lutra bench/train_cpu.lua %s 2>/dev/null"):format(root,
    table.concat(self_args, " ")))
  local out = p and p:read("*a") or ""
  if p then p:close() end
  local ok, r = pcall(lt.json.decode, out:match("{.*}") or "")
  if ok and r then
    print(("%-8s %12.0f %9.0f MiB %10.4f   (2 ranks x 1 thread, data parallel, the same global batch; RSS of rank 0)")
      :format("lutra x2", r.tokens_per_s, r.peak_rss / 2 ^ 20, r.loss))
  else
    print("lutra x2: mpirun not available or the 2-rank run failed")
  end
end
local t = bench_torch()
if t then
  print(("%-8s %12.0f %9.0f MiB %10.4f   (torch %s)"):format("torch", t.tokens_per_s, t.peak_rss / 2 ^ 20, t.loss, t.torch))
  print(("lutra / torch tokens/s: %.2f"):format(l.tokens_per_s / t.tokens_per_s))
else
  print("torch: not available at /usr/bin/python3")
end
