--- bench/model_cpu.lua: GPT-2 forward+backward on the CPU, lutra side by
-- side with PyTorch (Debian's python3-torch, bench/model_cpu_torch.py): the
-- same weights (lutra's init, saved and loaded by the PyTorch side: the
-- losses of the batch must agree), batch and thread count. PyTorch runs
-- twice, under its own default thread environment and under lutra's
-- (OMP_WAIT_POLICY, OPENBLAS_THREAD_TIMEOUT: host/app/main.c), as persistent
-- processes; the three take turns a step at a time (bench/interleave.lua),
-- and the table holds each one's median over the same rounds: ms per step,
-- tokens/s and GFLOP/s (llm.c's count: 6N + 6 L C T FLOPs per token, N all
-- parameters), and lutra's speed over PyTorch's.
--
--   ./lutra bench/model_cpu.lua [--rounds=5] [--tiny_rounds=100] [--models=gpt2-tiny,gpt2] [--quick]
--
-- --quick: gpt2-tiny only, 3 rounds (that the script runs: tests/lua/bench_spec.lua).
local lt = require "lutra"
local I = require "bench.interleave"

local cfg = lt.config { rounds = 5, tiny_rounds = 100, models = "gpt2-tiny,gpt2", B = 4, T = 64, quick = false,
  _help = { rounds = "timed rounds for the models other than gpt2-tiny (each runs every side once)",
    tiny_rounds = "timed rounds for gpt2-tiny", quick = "gpt2-tiny only, 3 rounds" } }
if cfg.quick then cfg.models, cfg.tiny_rounds = "gpt2-tiny", 3 end
local B, T = cfg.B, cfg.T
local threads = lt.num_threads()
local torch_cmd = "/usr/bin/python3 bench/model_cpu_torch.py"

local envs = { { name = "torch", label = "default", env = I.default_env },
  { name = "torch*", label = "lutra's", env = I.lutra_env() } }

print(("GPT-2 forward+backward, B=%d T=%d, the same weights and batch; medians of interleaved rounds"):format(B, T))
print(("threads: lutra %d (%s)"):format(threads, I.describe_env()))

local function bench(name)
  local m = lt.models.gpt2(name)
  local mc = m.config
  local V = mc.vocab_size
  local x, y = lt.randint(0, V, { B, T }), lt.randint(0, V, { B, T })
  local dir = io.popen("mktemp -d"):read("*l")
  lt.save(dir .. "/weights.safetensors", m:state_dict())
  lt.save(dir .. "/batch.safetensors", { x = x, y = y })
  local sides = { { name = "lutra", run = function()
    local t0 = lt.clock()
    local loss = m:loss(x, y)
    loss:backward()
    m:zero_grad()
    return lt.clock() - t0
  end } }
  local loss0 = { lutra = lt.no_grad(function() return m:loss(x, y):item() end) }
  local peers, missing = {}, {}
  for _, e in ipairs(envs) do
    local p, err = I.peer { env = e.env, cmd = ("%s %s %s %d %d %d %d %d %d"):format(torch_cmd,
      dir .. "/weights.safetensors", dir .. "/batch.safetensors", mc.n_layer, mc.n_head, mc.n_embd, V,
      mc.block_size, threads) }
    if p then
      peers[#peers + 1] = { e = e, p = p }
      loss0[e.name] = p:call("loss").loss
      sides[#sides + 1] = { name = e.name, run = function() return p:call("step").seconds end }
    else
      missing[#missing + 1] = ("%-10s %-7s not run (%s env): %s"):format(name, e.name, e.label, err:gsub("\n", " | "))
    end
  end
  os.execute("rm -rf " .. I.shell_quote(dir))
  local r = I.rounds(name == "gpt2-tiny" and cfg.tiny_rounds or cfg.rounds, sides)
  for _, pe in ipairs(peers) do pe.p:close() end

  local n = m:num_parameters()
  local flops = (6 * n + 6 * mc.n_layer * mc.n_embd * T) * B * T
  local function row(side, note)
    local s = r.median[side]
    print(("%-10s %-7s %11d %6d %11.4f %10.1f %9.0f %8.1f  %s"):format(name, side, n, r.n, loss0[side], s * 1e3,
      B * T / s, flops / s * 1e-9, note))
  end
  row("lutra", "")
  for _, pe in ipairs(peers) do
    local info = pe.p.info
    row(pe.e.name, ("%.2f  %s env: %d threads, %d inter-op (%s)"):format(r:ratio(pe.e.name, "lutra"), pe.e.label,
      info.threads, info.interop, I.describe_env(info.env)))
  end
  for _, line in ipairs(missing) do print(line) end
end

print(("%-10s %-7s %11s %6s %10s %10s %9s %8s  %s"):format("model", "runtime", "params", "rounds", "step-0 loss",
  "ms/step", "tokens/s", "GFLOP/s", "lutra/x"))
for name in cfg.models:gmatch("[^,]+") do bench(name) end
print("lutra/x: lutra's speed over that side's (its median step time over lutra's, the same rounds)")
print("torch: PyTorch under its default thread environment; torch*: under lutra's")
