-- tests/dist/tp_train_spec.lua: training a tensor-parallel model with
-- lt.train over a mesh (np=2: tp=2, dp=1; np=4: dp=2 x tp=2), against the
-- same whole model trained in one process on the global batches (each rank
-- computes that reference itself, from the same seed). The tiny model:
-- a replicated embedding, two blocks of LayerNorm -> ColumnParallelLinear
-- -> GELU -> RowParallelLinear (biases; the row bias replicated) with a
-- residual, a final LayerNorm and a replicated head, all f64. For plain
-- AdamW (the grad_scale path), an AdamW behind a wrapper (the gradients
-- scaled) and ZeRO stages 1, 2 and 3 over the DP group, with clipping
-- firing at every step and not at all: every step's loss and gradient norm
-- (1e-10 relative: the norm counts each parameter once), every final
-- weight (shards gathered; 1e-10), and the replicated parameters bitwise
-- equal on the TP ranks (tp.check_replicated). Bad groups (the TP group,
-- the world) are refused on every rank; check_replicated names a
-- replicated parameter that differs and a shard whose shape does;
-- lt.train's validation loss is one process's (a validation loader split
-- by the job's ranks refused on every rank); a preemption signal on one
-- TP rank reaches every rank of the job at the same step. Prints the bytes
-- per rank (lt.dist.memory_bytes).
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local nn, tp = lt.nn, lt.dist.tp

local V, C, HID, B, T, STEPS = 16, 8, 32, 2, 8, 6
local F64 = { dtype = "f64" }

local Block = nn.Module:extend("TinyBlock")
function Block:init(g, tpg)
  self.ln = nn.LayerNorm(C, F64)
  local fc = nn.Linear(C, HID, { dtype = "f64", generator = g })
  local proj = nn.Linear(HID, C, { dtype = "f64", generator = g })
  if tpg then
    self.fc, self.proj = tp.ColumnParallelLinear.from(fc, tpg), tp.RowParallelLinear.from(proj, tpg)
  else
    self.fc, self.proj = fc, proj
  end
end
function Block:forward(h) return h + self.proj(self.fc(self.ln(h)):gelu()) end

local Tiny = nn.Module:extend("TinyTP")
-- the whole model from seed 11 (tpg nil), or its tensor-parallel slices
function Tiny:init(tpg)
  local g = lt.Generator(11)
  self.wte = nn.Embedding(V, C, { dtype = "f64", generator = g })
  self.blocks = nn.ModuleList { Block(g, tpg), Block(g, tpg) }
  self.lnf = nn.LayerNorm(C, F64)
  self.head = nn.Linear(C, V, { dtype = "f64", generator = g, bias = false })
  if tpg then self.tp_group = tpg end
end
function Tiny:forward(x)
  local h = self.wte(x)
  for _, b in ipairs(self.blocks:list()) do h = b(h) end
  return self.head(self.lnf(h))
end

-- the global batches (dp * B rows a step); rows = {first, count} picks a DP rank's
local function loader(dp, first, count)
  local g = lt.Generator(23)
  local out = {}
  for i = 1, STEPS do
    local ids = lt.randint(0, V, { B * dp, T + 1 }, { generator = g }):narrow(1, first, count)
    out[i] = { ids:narrow(2, 1, T):contiguous(), ids:narrow(2, 2, T):contiguous() }
  end
  return H.loader(out)
end

local SETTINGS = { lr = 1e-2, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
local function settings(extra)
  local s = {}
  for k, v in pairs(SETTINGS) do s[k] = v end
  for k, v in pairs(extra or {}) do s[k] = v end
  return s
end

-- a scratch directory for a run's metrics, removed after fn(dir)
local function scratch(fn)
  local base = os.tmpname()
  local ok, a, b, c = pcall(fn, base .. "-tp-train")
  os.execute("rm -rf '" .. base .. "-tp-train'")
  os.remove(base)
  if not ok then error(a, 0) end
  return a, b, c
end

local train_in
local function train(model, opt, data, clip, ddp)
  return scratch(function(dir) return train_in(dir, model, opt, data, clip, ddp) end)
end

function train_in(dir, model, opt, data, clip, ddp)
  local losses, norms, mem = {}, {}, nil
  lt.train { model = model, optimizer = opt, train = data, steps = STEPS, clip = clip, quiet = true,
    out_dir = dir, ddp = ddp or false, eval_at_start = false,
    on_step = function(rec)
      losses[rec.step], norms[rec.step] = rec.loss, rec.grad_norm
      if rec.step == STEPS then mem = lt.dist.memory_bytes(model, opt, ddp) end
    end }
  return losses, norms, mem
end

-- a shard put back whole: all_gather over the TP group along its dim
local function whole_of(p, rec, g)
  if rec.dim == 1 then return lt.dist.all_gather(p:detach():contiguous(), { group = g }) end
  local t = lt.dist.all_gather(p:detach():transpose(1, rec.dim):contiguous(), { group = g })
  return t:transpose(1, rec.dim)
end

local function mesh_of(w)
  local m = lt.dist.mesh { tp = 2 }
  return m, m.sizes.dp, m.coords.dp
end

local refs = {} -- clip -> {losses, norms, model}
local function reference(clip, dp)
  if not refs[clip] then
    local model = Tiny()
    local losses, norms = train(model, lt.optim.AdamW(model, settings()), loader(dp, 1, B * dp), clip)
    refs[clip] = { losses = losses, norms = norms, model = model }
  end
  return refs[clip]
end

-- an optimizer lt.optim does not own (lt.train clips its gradients: the path without grad_scale)
local function wrapped(model)
  local inner = lt.optim.AdamW(model, settings())
  return { groups = inner.groups, parameters = function() return inner:parameters() end,
    zero_grad = function() inner:zero_grad() end, set_lr = function(_, lr) inner:set_lr(lr) end,
    step = function() inner:step() end }
end

local mems = {}
-- stage 0: AdamW (grad_scale), 1-3: ZeRO, "wrapped": AdamW behind a wrapper
local function case(stage, clip, w)
  local mesh, dp, d = mesh_of(w)
  local ref = reference(clip, dp)
  local model = Tiny(mesh.tp)
  local zero = type(stage) == "number" and stage > 0
  local ddp = lt.dist.DataParallel(model, { group = mesh.dp,
    gradients = zero and stage >= 2 and "none" or "all_reduce" })
  local opt = stage == "wrapped" and wrapped(model) or stage == 0 and lt.optim.AdamW(model, settings())
    or lt.dist.Zero(model, settings { stage = stage, group = mesh.dp })
  local losses, norms, mem = train(model, opt, loader(dp, d * B + 1, B), clip, ddp)
  mems[stage] = mem
  local what = ("stage %s, clip %g"):format(stage, clip)
  for s = 1, STEPS do
    local rl = math.abs(losses[s] - ref.losses[s]) / ref.losses[s]
    assert(rl < 1e-10, ("%s, step %d: loss %.15g, one process %.15g"):format(what, s, losses[s], ref.losses[s]))
    local rn = math.abs(norms[s] - ref.norms[s]) / ref.norms[s]
    assert(rn < 1e-10, ("%s, step %d: gradient norm %.15g, one process %.15g"):format(what, s, norms[s], ref.norms[s]))
    if clip < 1 then assert(ref.norms[s] > clip, what .. ": clipping should fire") end
    if clip > 1 then assert(ref.norms[s] < clip, what .. ": clipping should not fire") end
  end
  if opt.unshard then opt:unshard() end
  local sharded = tp.sharded(model)
  local want = {}
  for _, np in ipairs(ref.model:named_parameters()) do want[np[1]] = np[2] end
  local n = 0
  for _, np in ipairs(model:named_parameters()) do
    local rec = sharded[np[2]]
    local got = rec and whole_of(np[2], rec, mesh.tp) or np[2]
    H.close(got, want[np[1]], 1e-10, what .. ": " .. np[1])
    n = n + 1
  end
  assert(n == #ref.model:parameters(), what .. ": the parameter count")
  assert(tp.check_replicated(model) == true, what .. ": check_replicated")
end

for _, clip in ipairs { 0.05, 100 } do
  for _, stage in ipairs { 0, 1, 2, 3, "wrapped" } do
    local name = stage == 0 and "AdamW" or stage == "wrapped" and "a wrapped AdamW" or ("ZeRO " .. stage)
    H.test(("dp x tp=2, %s, clip %g (%s): losses, norms and weights of one process"):format(
      name, clip, clip < 1 and "fires" or "does not fire"), function(r, w)
      case(stage, clip, w)
      if stage == 3 and clip > 1 and r == 0 then
        print(("# bytes per rank, dp=%d x tp=2 (params / grads / optimizer / total):"):format(w / 2))
        for s = 0, 3 do
          local m = mems[s]
          print(("#   ZeRO %d: %d / %d / %d / %d"):format(s, m.params, m.grads, m.optimizer, m.total))
        end
      end
    end)
  end
end

H.test("bytes per rank at tp=1 (one process's whole model)", function(r)
  local model = Tiny()
  local opt = lt.optim.AdamW(model, settings())
  local _, _, mem = train(model, opt, loader(1, 1, B), 0)
  if r == 0 then
    print(("# bytes, tp=1 (params / grads / optimizer / total): %d / %d / %d / %d"):format(mem.params, mem.grads,
      mem.optimizer, mem.total))
  end
end)

H.test("a ZeRO or DataParallel group that is the TP group or the world is refused on every rank", function(_, w)
  local mesh = mesh_of(w)
  local model = Tiny(mesh.tp)
  local right = "group = lt.dist.mesh{dp =, tp = 2}.dp"
  H.raises(function() lt.dist.Zero(model, settings { stage = 1, group = mesh.tp }) end, "Zero: the model is "
    .. "tensor-parallel over 2 ranks", "holds ranks of one tensor-parallel group", right)
  H.raises(function() lt.dist.Zero(model, settings { stage = 3 }) end, "the group (the world)", right)
  H.raises(function() lt.dist.DataParallel(model, { group = mesh.tp }) end, "DataParallel: the model is", right)
  H.raises(function() lt.dist.DataParallel(model) end, "DataParallel", "the world", right)
  H.raises(function()
    lt.train { model = model, optimizer = lt.optim.AdamW(model), train = loader(1, 1, B), steps = 1, quiet = true }
  end, "tensor-parallel over 2 ranks", "pass ddp = lt.dist.DataParallel(model, {group = mesh.dp})")
end)

H.test("check_replicated names a replicated parameter that differs, and a shard of another shape", function(_, w)
  local mesh = mesh_of(w)
  local model = Tiny(mesh.tp)
  assert(tp.check_replicated(model) == true)
  local keep = model.lnf.weight:clone()
  if mesh.coords.tp == 1 then
    lt.no_grad(function() model.lnf.weight:narrow(1, 3, 1):add_(1e-15) end)
  end
  H.raises(function() tp.check_replicated(model) end, "replicated parameter lnf.weight differs", "element 3 of 8")
  lt.no_grad(function() model.lnf.weight:copy_(keep) end)
  assert(tp.check_replicated(model) == true)
  local b = model.blocks[2].fc.bias
  if mesh.coords.tp == 1 then model.blocks[2].fc.bias = nn.Parameter(lt.zeros({ b:numel() + 1 }, F64)) end
  H.raises(function() tp.check_replicated(model) end, "the shard blocks.1.fc.bias differs in shape",
    ("from %d to %d"):format(b:numel(), b:numel() + 1))
end)

H.test("lt.train's evaluation under TP: every rank runs the forward, the val loss one process's", function(_, w)
  local mesh, dp, d = mesh_of(w)
  local function run(model, opt, data, ddp)
    return scratch(function(dir)
      return lt.train { model = model, optimizer = opt, train = data, steps = 2, quiet = true, ddp = ddp or false,
        out_dir = dir, val = loader(1, 1, B), eval_every = 2, eval_batches = 3 }
    end)
  end
  local whole = Tiny()
  local want = run(whole, lt.optim.AdamW(whole, settings()), loader(dp, 1, B * dp))
  local model = Tiny(mesh.tp)
  local got = run(model, lt.optim.AdamW(model, settings()), loader(dp, d * B + 1, B),
    lt.dist.DataParallel(model, { group = mesh.dp }))
  assert(got.val_step == 2 and want.val_step == 2, "evaluated at step 2")
  local rel = math.abs(got.val_loss - want.val_loss) / want.val_loss
  assert(rel < 1e-10, ("val loss %.15g, one process %.15g"):format(got.val_loss, want.val_loss))
  -- a validation loader split by the job's ranks (each TP rank its own batches): refused on every rank
  local bad = Tiny(mesh.tp)
  local r = lt.dist.rank()
  H.raises(function()
    scratch(function(dir)
      return lt.train { model = bad, optimizer = lt.optim.AdamW(bad, settings()), train = loader(dp, d * B + 1, B),
        steps = 2, quiet = true, ddp = lt.dist.DataParallel(bad, { group = mesh.dp }), out_dir = dir,
        val = loader(w, r * B + 1, B), eval_every = 2, eval_batches = 1 }
    end)
  end, "the tensor-parallel ranks read different validation batches", "lt.data.shards{rank = mesh.coords.dp")
end)

H.test("a preemption signal on one TP rank only stops every rank of the job after the same step", function(r, w)
  local C = require("lutra.capi").C
  local mesh, dp, d = mesh_of(w)
  local model = Tiny(mesh.tp)
  local S = lt.train.step.new { model = model, optimizer = lt.optim.AdamW(model, settings()),
    ddp = lt.dist.DataParallel(model, { group = mesh.dp }) }
  local data = loader(dp, d * B + 1, B)
  local function next_batch() return data:next() end
  C.lt_preempt_clear()
  C.lt_preempt_watch(1)
  local ok, err = pcall(function()
    assert(S:run(1, next_batch).signal == 0, "step 1: no signal")
    -- the last rank: TP rank 1, in another DP group than rank 0's when dp = 2
    if r == w - 1 then
      local pid = io.open("/proc/self/stat"):read("*l"):match("^(%d+)")
      os.execute("kill -USR1 " .. pid)
      local t0 = os.clock()
      while C.lt_preempt_signal() == 0 and os.clock() - t0 < 5 do end
      assert(C.lt_preempt_signal() == 10, "the signal did not arrive")
    end
    local sig = S:run(2, next_batch).signal
    assert(sig == 10, ("step 2: rank %d sees signal %s, not SIGUSR1's 10"):format(r, tostring(sig)))
  end)
  C.lt_preempt_watch(0)
  C.lt_preempt_clear()
  assert(ok, err)
end)

H.run("tests/dist/tp_train_spec.lua")
