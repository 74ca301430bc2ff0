-- tests/dist/pp_train_spec.lua: lt.train (the loop, not only lt.train.step)
-- with a model split into pipeline stages, against one process. A 4-block
-- GPT-2 (tied head) trained 4 f32 steps of 4 micro-batches with
-- evaluations: every step's loss, gradient norm and validation loss as
-- rank 0 records them (metrics.jsonl) equal one process's lt.train on the
-- same batches to 1e-5 relative (the validation loss is each DP rank's
-- own batches', as lt.train evaluates under data parallelism); the FLOPs per token (MFU) count the whole
-- model, not the stage. np=2: pp=2 1F1B and GPipe; np=4: pp=4 1F1B,
-- dp=2 x pp=2 GPipe, pp=2 x dp=2 interleaved (v = 2). Refused before any
-- step, on every rank: no ddp, sampling, an unknown pp_schedule, a
-- pp_schedule for a model that is not split. After model:to("bf16") the
-- tied weight the pipeline sums (model.pp.tied, .copy) is the model's.
-- lt.train's pp_schedule is the kind the step's executor builds.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"
local P = require "pp_layouts"
local executor = require "lutra.dist.pp.executor"

lt.dist.init()
lt.dist.set_timeout(120)
local world, rank = lt.dist.world_size(), lt.dist.rank()

local V, B, T, M, STEPS = 37, 2, 8, 4, 4

-- the global batches: STEPS * M micro-batches of dp * B rows, and 2 validation batches
local function data(dp, n)
  local g = lt.Generator(n)
  local out = {}
  for i = 1, (n == 11 and STEPS * M or 2) do
    local x = lt.randint(0, V, { dp * B, T + 1 }, { generator = g, dtype = "i64" })
    out[i] = { x:narrow(2, 1, T):contiguous(), x:narrow(2, 2, T):contiguous() }
  end
  return out
end

-- a loader of rows [first, first + count) of the batches; restartable (validation)
local function rows(batches, first, count)
  local i = 0
  return {
    next = function()
      i = i + 1
      local b = batches[i]
      if b then return b[1]:narrow(1, first, count):contiguous(), b[2]:narrow(1, first, count):contiguous() end
    end,
    state = function() return { i = i } end, load_state = function(_, s) i = s.i end,
  }
end

local root = H.shared_dir("lutra-pp-train")

-- lt.train's recorded steps and evaluations: {[step] = {loss, grad_norm}}, {[step] = val_loss}
local function read_metrics(path)
  local steps, vals = {}, {}
  for line in io.lines(path) do
    local r = lt.json.decode(line)
    if r.loss then steps[r.step] = { r.loss, r.grad_norm } end
    if r.val_loss then vals[r.step] = r.val_loss end
  end
  return steps, vals
end

local function run(model, dp, first, o)
  local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3, weight_decay = 0.1 })
  local ddp = o.dp_group and lt.dist.DataParallel(model, { group = o.dp_group }) or nil
  local s = lt.train { model = model, optimizer = opt, train = rows(data(dp, 11), first, B * (o.whole and dp or 1)),
    val = rows(data(dp, 12), o.val_first or first, B), eval_every = 2, eval_batches = 2,
    steps = STEPS, accum = M, clip = 0.05, ddp = ddp, pp_schedule = o.schedule, quiet = true, out_dir = root,
    name = o.name, eval_at_start = true }
  return s
end

local function check(name, L)
  H.test(name .. ": lt.train's logged losses, norms and validation losses equal one process's", function()
    local pp = L.pp
    local dp = world / pp
    local mesh = lt.dist.mesh { pp = pp }
    -- the reference: one process (every rank alone, its own run directory; no ddp)
    -- (its validation: this DP rank's rows, as lt.train evaluates each DP rank's own batches)
    local ref = run(P.gpt2 { n_layer = L.n_layer }, dp, 1, { whole = true, name = ("ref-%s-%d"):format(L.tag, rank),
      val_first = mesh.coords.dp * B + 1 })
    local ref_steps, ref_vals = read_metrics(("%s/ref-%s-%d/metrics.jsonl"):format(root, L.tag, rank))
    local model = P.gpt2 { pp = mesh.pp, virtual_stages = L.v, n_layer = L.n_layer }
    local got = run(model, dp, mesh.coords.dp * B + 1, { schedule = L.schedule, dp_group = mesh.dp, name = L.tag })
    assert(math.abs(got.loss - ref.loss) <= 1e-5 * math.abs(ref.loss), ("summary loss %.8f vs %.8f"):format(got.loss,
      ref.loss))
    assert(math.abs(got.val_loss - ref.val_loss) <= 1e-5 * ref.val_loss, ("summary val_loss %.8f vs %.8f"):format(
      got.val_loss, ref.val_loss))
    lt.dist.barrier()
    if rank == 0 then -- (rank 0, stage 0, records: its metrics are the job's)
      local steps, vals = read_metrics(("%s/%s/metrics.jsonl"):format(root, L.tag))
      for s = 1, STEPS do
        local a, b = steps[s], ref_steps[s]
        assert(a, "no step " .. s .. " in the metrics")
        assert(math.abs(a[1] - b[1]) <= 1e-5 * math.abs(b[1]) and math.abs(a[2] - b[2]) <= 1e-5 * b[2],
          ("step %d: loss %.8f vs %.8f, norm %.6f vs %.6f"):format(s, a[1], b[1], a[2], b[2]))
      end
      for _, s in ipairs { 0, 2, 4 } do
        assert(vals[s] and math.abs(vals[s] - ref_vals[s]) <= 1e-5 * ref_vals[s],
          ("val loss at step %d: %s vs %s"):format(s, tostring(vals[s]), tostring(ref_vals[s])))
      end
    end
  end)
end

if world == 2 then
  check("pp=2 1F1B", { pp = 2, schedule = "1f1b", tag = "pp2-1f1b" })
  check("pp=2 GPipe", { pp = 2, schedule = "gpipe", tag = "pp2-gpipe" })
elseif world == 4 then
  check("pp=4 1F1B", { pp = 4, schedule = "1f1b", tag = "pp4-1f1b" })
  check("dp=2 x pp=2 GPipe", { pp = 2, schedule = "gpipe", tag = "dp2-pp2-gpipe" })
  check("dp=2 x pp=2 interleaved (v = 2)", { pp = 2, v = 2, n_layer = 4, schedule = "interleaved", tag = "dp2-pp2-int" })
end

H.test("MFU's FLOPs per token count the whole model on every stage", function()
  local mesh = lt.dist.mesh { pp = world }
  local whole, split = P.gpt2 {}, P.gpt2 { pp = mesh.pp }
  local a, b = lt.train.log.flops_per_token(whole, T), lt.train.log.flops_per_token(split, T)
  assert(a == b, ("one process %d, the stage %d"):format(a, b))
  assert(lt.train.log.num_parameters(split) == whole:num_parameters(), "the stages' parameters summed")
end)

H.test("after model:to(\"bf16\") the tied weight the pipeline sums is the model's parameter", function()
  local mesh = lt.dist.mesh { pp = world }
  local model = P.gpt2 { pp = mesh.pp }
  model:to("bf16")
  local P_, holds = model.pp, {}
  for _, p in ipairs(model:parameters()) do holds[p] = true end
  if P_.first or P_.last then assert(P_.tied and holds[P_.tied], "model.pp.tied is not a parameter of the model") end
  if P_.last then assert(P_.copy and holds[P_.copy], "model.pp.copy is not a parameter of the model") end
  if not (P_.first or P_.last) then assert(P_.tied == nil and P_.copy == nil, "a middle stage holds a tied weight") end
end)

-- lt.train hands pp_schedule to the step's executor (the schedules give the
-- same numbers, so the losses above cannot tell whether it did): the kind
-- the executor builds, for each setting (none: 1F1B)
H.test("lt.train runs the pp_schedule it is given (the executor builds that kind)", function()
  local mesh = lt.dist.mesh { pp = world }
  local make = executor.make_schedule
  for _, kind in ipairs { "gpipe", "1f1b", false } do
    local model = P.gpt2 { pp = mesh.pp }
    local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
    local built = {}
    executor.make_schedule = function(k, ...)
      built[#built + 1] = k
      return make(k, ...)
    end
    local ok, err = pcall(lt.train, { model = model, optimizer = opt, train = rows(data(1, 11), 1, B), steps = 1,
      accum = M, quiet = true, out_dir = root, name = "schedule-" .. tostring(kind), pp_schedule = kind or nil,
      ddp = lt.dist.DataParallel(model, { group = mesh.dp }) })
    executor.make_schedule = make
    if not ok then error(err, 0) end
    local want = kind or "1f1b"
    assert(#built > 0, "no schedule built")
    for _, k in ipairs(built) do
      assert(k == want, ("pp_schedule = %s: the executor built %s"):format(tostring(kind), tostring(k)))
    end
  end
end)

H.test("lt.train refuses a pipeline without ddp, sampling, a bad pp_schedule, before any step", function()
  local mesh = lt.dist.mesh { pp = world }
  local model = P.gpt2 { pp = mesh.pp }
  local opt = lt.optim.AdamW(model:parameters(), { lr = 1e-3 })
  local train = rows(data(1, 11), 1, B)
  local base = { model = model, optimizer = opt, train = train, steps = 1, accum = M, quiet = true, out_dir = root,
    name = "refused" }
  local function with(t)
    local o = {}
    for k, v in pairs(base) do o[k] = v end
    for k, v in pairs(t) do o[k] = v end
    return o
  end
  H.raises(function() lt.train(with {}) end, "split into " .. world .. " pipeline stages", "pass ddp")
  local ddp = lt.dist.DataParallel(model, { group = mesh.dp })
  local tok = { encode = function() return { 1 } end, decode = function() return "" end, eot = 1 }
  H.raises(function() lt.train(with { ddp = ddp, sample_every = 1, sample = { tokenizer = tok } }) end,
    "sampling (sample_every = 1) is not available with a pipeline-parallel model", "stage " .. rank .. " of " .. world)
  H.raises(function() lt.train(with { ddp = ddp, pp_schedule = "zb" }) end, "pp_schedule must be", "got zb")
  local one = P.gpt2 {}
  H.raises(function() lt.train { model = one, optimizer = lt.optim.AdamW(one:parameters(), { lr = 1e-3 }),
    train = train, steps = 1, pp_schedule = "gpipe", quiet = true } end, "not split into stages")
end)

H.run("tests/dist/pp_train_spec.lua")
if rank == 0 then os.execute("rm -rf '" .. root .. "'") end
