--- bench/optim.lua: the optimizer's part of a training step for GPT-2's
-- parameters (124M by default), as a table: an AdamW step alone, global-norm
-- clipping that scales the gradients (lt.optim.clip_grad_norm: a pass and a
-- launch per parameter) then a step, and the clip's factor taken into the
-- step instead (lt.optim.grad_norm, then opt:step{grad_scale}: what lt.train
-- does). ms per step (median of --reps, fresh random gradients each time,
-- the device synchronised around each) and GB/s over the bytes the AdamW
-- update moves (gradient, parameter, master, two moments, each read and
-- written where it is).
--
--   ./lutra bench/optim.lua [--model=gpt2] [--device=cpu|cuda] [--dtype=f32|bf16] [--reps=5]
local lt = require "lutra"

local opts = { model = "gpt2", device = "cpu", dtype = "f32", reps = 5 }
for _, a in ipairs(arg or {}) do
  local k, v = a:match("^%-%-([%w_]+)=(.*)$")
  if not k or opts[k] == nil then
    error("usage: lutra bench/optim.lua [--model=gpt2] [--device=cpu|cuda] [--dtype=f32|bf16] [--reps=5]")
  end
  opts[k] = tonumber(v) or v
end
local cuda = opts.device:sub(1, 4) == "cuda"
if cuda then
  local n, why = lt.cuda.device_count()
  if n == 0 then
    print(("skipped: no CUDA device (%s)"):format(why))
    return
  end
end
local function sync() if cuda then lt.cuda.synchronize() end end

local model = lt.models.gpt2(opts.model, { generator = lt.Generator(1) })
model:to(opts.device, opts.dtype)
local params = model:parameters()
local numel = 0
for _, p in ipairs(params) do numel = numel + p:numel() end
local gen = lt.Generator(2)
local grads = {} -- drawn once, copied in before each timed step (the step never sees a stale gradient)
for i, p in ipairs(params) do
  grads[i] = lt.randn(p:shape(), { generator = gen, device = opts.device }):to(opts.dtype)
end
local function set_grads()
  for i, p in ipairs(params) do p.grad = grads[i]:clone() end
  sync()
end
local opt = lt.optim.AdamW(model, { lr = 1e-4, weight_decay = 0.1 })
set_grads()
opt:step() -- the state is allocated here, not in a timed step

local function median_ms(fn)
  local ts = {}
  for i = 1, opts.reps do
    set_grads()
    local t0 = lt.clock()
    fn()
    sync()
    ts[i] = lt.clock() - t0
  end
  table.sort(ts)
  return ts[math.floor((#ts + 1) / 2)] * 1e3
end

-- bytes of one AdamW update: gradient read; parameter read and written (or,
-- for 16-bit parameters, the f32 master read and written and the parameter
-- written); both f32 moments read and written
local es = ({ f32 = 4, f64 = 8, bf16 = 2, f16 = 2 })[opts.dtype]
local bytes = numel * (es + (es < 4 and (8 + es) or 2 * es) + 16)
print(("%s on %s, %s, %.1fM parameters (%d tensors)"):format(opts.model, opts.device, opts.dtype, numel / 1e6,
  #params))
print(("%-52s %10s %10s"):format("work", "ms/step", "GB/s"))
local rows = {
  { "AdamW step", function() opt:step() end },
  { "clip_grad_norm (gradients scaled) + step", function()
    lt.optim.clip_grad_norm(params, 1.0)
    opt:step()
  end },
  { "grad_norm + step{grad_scale} (lt.train's clip)", function()
    local norm = lt.optim.grad_norm(params)
    opt:step { grad_scale = lt.optim.clip_scale(norm, 1.0) }
  end },
}
for _, r in ipairs(rows) do
  local ms = median_ms(r[2])
  print(("%-52s %10.2f %10.1f"):format(r[1], ms, bytes / (ms * 1e-3) / 1e9))
end
