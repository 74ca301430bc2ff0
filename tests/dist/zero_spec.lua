-- tests/dist/zero_spec.lua: ZeRO stages 1 and 2 (lt.dist.Zero) against
-- plain data parallelism: the same global batches, 10 f32 AdamW steps with
-- clipping and 2 micro-batches give the same logged losses (1e-5 relative)
-- and weights (1e-4), and each rank holds about 1/world of the optimizer
-- state (moments) that data parallelism holds on every rank.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"

local STEPS, ACCUM, B, T = 10, 2, 2, 16

local function batches(w, r)
  local g = lt.Generator(77)
  local out = {}
  for i = 1, STEPS * ACCUM do
    local ids = lt.randint(0, 512, { B * w, T + 1 }, { generator = g })
    local mine = ids:narrow(1, r * B + 1, B)
    out[i] = { mine:narrow(2, 1, T):contiguous(), mine:narrow(2, 2, T):contiguous() }
  end
  local i = 0
  return { next = function()
    i = i + 1
    if out[i] then return out[i][1], out[i][2] end
  end }
end

local function run(stage, r, w)
  local model = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) })
  local ddp = lt.dist.DataParallel(model, { gradients = stage == 2 and "none" or "all_reduce" })
  local settings = { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
  local opt
  if stage == 0 then
    opt = lt.optim.AdamW(model, settings)
  else
    settings.stage = stage
    opt = lt.dist.Zero(model, settings)
  end
  local losses, norms = {}, {}
  lt.train { model = model, optimizer = opt, train = batches(w, r), steps = STEPS, accum = ACCUM, clip = 0.5,
    quiet = true, out_dir = os.tmpname() .. "-zero", ddp = ddp,
    on_step = function(rec) losses[rec.step], norms[rec.step] = rec.loss, rec.grad_norm end }
  local bytes = 0
  if stage == 0 then
    for _, s in pairs(opt.state) do
      for _, t in pairs(s) do if type(t) ~= "boolean" then bytes = bytes + t:numel() * 4 end end
    end
  else
    bytes = opt:state_bytes()
  end
  return model, losses, norms, bytes
end

H.test("ZeRO stages 1 and 2 match data parallelism and shard the optimizer state", function(r, w)
  local ref, ref_losses, ref_norms, ref_bytes = run(0, r, w)
  for _, stage in ipairs { 1, 2 } do
    local model, losses, norms, bytes = run(stage, r, w)
    for s = 1, STEPS do
      local rel = math.abs(losses[s] - ref_losses[s]) / ref_losses[s]
      assert(rel < 1e-5, ("stage %d step %d: loss %.8f vs %.8f"):format(stage, s, losses[s], ref_losses[s]))
      assert(math.abs(norms[s] - ref_norms[s]) < 1e-4 * ref_norms[s], ("stage %d step %d: norm %.8f vs %.8f")
        :format(stage, s, norms[s], ref_norms[s]))
    end
    local a, b = model:parameters(), ref:parameters()
    for i = 1, #a do H.close(a[i], b[i], 1e-4, ("stage %d parameter %d"):format(stage, i)) end
    -- each rank: its chunk of every flat group, so at most about 1/world (+ a row per group)
    assert(bytes <= ref_bytes / w + 64, ("stage %d: %d bytes of state on rank %d, data parallel %d"):format(stage,
      bytes, r, ref_bytes))
    local total = lt.tensor({ bytes }, { dtype = "f64" })
    lt.dist.all_reduce(total)
    assert(total:item() == ref_bytes, ("the ranks' state adds up to %d, not %d"):format(total:item(), ref_bytes))
  end
end)

H.test("Zero rejects bad settings", function()
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(1) })
  H.raises(function() lt.dist.Zero(m, { stage = 3 }) end, "stage must be 1 or 2")
  H.raises(function() lt.dist.Zero(m, { stage = 1, optimizer = "Lion" }) end, "optimizer must be AdamW or SGD")
  H.raises(function() lt.dist.DataParallel(m, { gradients = "sum" }) end, "gradients must be")
  local data = { next = function() return lt.zeros({ 1, 4 }, { dtype = "i64" }), lt.zeros({ 1, 4 }, { dtype = "i64" }) end }
  for _, case in ipairs { { 2, "all_reduce", "needs DataParallel{gradients = \"none\"}" },
    { 1, "none", "needs DataParallel{gradients = \"all_reduce\"}" } } do
    H.raises(function()
      lt.train { model = m, optimizer = lt.dist.Zero(m, { stage = case[1] }), train = data, steps = 1, quiet = true,
        ddp = lt.dist.DataParallel(m, { gradients = case[2] }) }
    end, case[3])
  end
  H.raises(function()
    lt.train { model = m, optimizer = lt.optim.SGD(m, { lr = 0.1 }), train = data, steps = 1, quiet = true,
      ddp = lt.dist.DataParallel(m, { gradients = "none" }) }
  end, "leaves gradients unreduced")
end)

H.run("zero_spec")
