-- tests/dist/ckpt_spec.lua: checkpoints of a job: data parallelism and
-- ZeRO stages 1, 2 and 3 save (weights once, optimizer state once or one file
-- per rank, every rank's loader position) and resume: 4 steps, a
-- checkpoint, a fresh job resuming to step 8 gives the losses and weights
-- of 8 uninterrupted steps; a checkpoint of another world size is refused
-- (its weights alone load in one process); resume = "auto" passes over a
-- checkpoint with a corrupt optimizer shard on every rank alike.
local lt = require "lutra"
package.path = "tests/dist/?.lua;" .. package.path
local H = require "harness"

local ROOT
local function root()
  if ROOT then return ROOT end
  ROOT = H.shared_dir("lutra-dist-ckpt")
  if lt.dist.rank() == 0 then
    os.execute("mkdir -p " .. ROOT .. "/data")
    lt.data.write_shard(ROOT .. "/data/train_000000.bin", lt.randint(0, 512, { 8000 }, { generator = lt.Generator(3) }), 512)
  end
  lt.dist.barrier()
  return ROOT
end

local function run(stage, name, steps, resume, on_step)
  local dir = root()
  local model = lt.models.gpt2("gpt2-tiny", { dropout = 0.1, generator = lt.Generator(5) })
  local ddp = lt.dist.DataParallel(model, { gradients = stage >= 2 and "none" or "all_reduce" })
  local settings = { lr = 3e-3, betas = { 0.9, 0.95 }, weight_decay = 0.1 }
  local opt
  if stage == 0 then opt = lt.optim.AdamW(model, settings) else
    settings.stage = stage
    opt = lt.dist.Zero(model, settings)
  end
  local data = lt.data.shards { path = dir .. "/data/train", batch = 2, seq = 16, seed = 9 }
  lt.manual_seed(1)
  local losses = {}
  local summary = lt.train { model = model, optimizer = opt, train = data, steps = steps, clip = 1.0, quiet = true, out_dir = dir,
    name = name, ddp = ddp, ckpt_every = 4, resume = resume or "none",
    schedule = lt.optim.schedules.cosine { lr = 3e-3, warmup = 2, steps = 8 },
    on_step = function(rec)
      losses[rec.step] = rec.loss
      if on_step then on_step(rec) end
    end }
  if opt.unshard then opt:unshard() end -- ZeRO 3: the whole parameters, for the comparison
  return model, losses, summary
end

local finals, wholes = {}, {} -- stage -> the parameters after 8 steps (resumed at step 4), the uninterrupted losses
for _, stage in ipairs { 0, 1, 2, 3 } do
  H.test(("stage %d: a job resumed from its step-4 checkpoint repeats the uninterrupted run"):format(stage), function(r, w)
    local whole, a = run(stage, "whole" .. stage, 8)
    run(stage, "cut" .. stage, 4)
    local resumed, b = run(stage, "cut" .. stage, 8, "auto")
    for s = 5, 8 do
      assert(b[s] and a[s] == b[s], ("step %d: %s vs %s"):format(s, tostring(b[s]), tostring(a[s])))
    end
    local pa, pb = whole:parameters(), resumed:parameters()
    for i = 1, #pa do H.close(pa[i], pb[i], 0, "parameter " .. i) end
    finals[stage], wholes[stage] = pb, a
    local st = lt.ckpt.read_state(root() .. "/cut" .. stage .. "/ckpt/step_00000008")
    assert(st.layout.world_size == w and st.layout.zero == stage, "layout")
    assert(#st.loaders == w, "one loader state per rank")
    if stage > 0 then assert(st.files[("optimizer-rank%05d.safetensors"):format(w - 1)], "one optimizer file per rank") end
  end)
end

H.test("SIGUSR1 to the last rank alone stops every rank after the same step with a checkpoint; resuming repeats the run", function(r, w)
  local whole, a = run(3, "whole3b", 8)
  local _, _, summary = run(3, "preempt3", 8, nil, function(rec)
    -- the shell's parent is this process
    if rec.step == 3 and r == w - 1 then os.execute("kill -USR1 $PPID") end
  end)
  assert(summary.preempted == "SIGUSR1", "preempted: " .. tostring(summary.preempted))
  local stopped = lt.tensor({ summary.steps, -summary.steps }, { dtype = "f64" })
  lt.dist.all_reduce(stopped, { op = "max" })
  local mx = stopped:totable()
  assert(mx[1] == -mx[2], "the ranks stopped after different steps")
  assert(summary.steps >= 3 and summary.steps < 8, "stopped after step " .. summary.steps)
  assert(summary.checkpoint and summary.checkpoint:find(("step_%08d"):format(summary.steps), 1, true),
    "checkpoint " .. tostring(summary.checkpoint))
  local resumed, b = run(3, "preempt3", 8, "auto")
  for s = summary.steps + 1, 8 do
    assert(b[s] and a[s] == b[s], ("step %d: %s vs %s"):format(s, tostring(b[s]), tostring(a[s])))
  end
  local pa, pb = whole:parameters(), resumed:parameters()
  for i = 1, #pa do H.close(pa[i], pb[i], 0, "parameter " .. i) end
end)

H.test("a checkpoint of another world size is refused on every rank (optimizer state and loaders)", function(r, w)
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) })
  local opt = lt.optim.AdamW(m, { lr = 1e-3 })
  H.raises(function() lt.ckpt.load(root() .. "/whole0/ckpt/step_00000008", { model = m, opt = opt, world_size = w + 1 }) end,
    "layout.world_size is " .. w, "the weights alone load anywhere")
end)

H.test("the weights of a job's checkpoint (every ZeRO stage) load in one process, as the job left them", function(r, w)
  for _, stage in ipairs { 0, 1, 2, 3 } do
    -- a single process's load (world size 1), as recipes/sample.lua does
    local m = lt.ckpt.load_model(root() .. "/cut" .. stage .. "/ckpt")
    local got = m:parameters()
    assert(finals[stage] and #got == #finals[stage], "stage " .. stage .. ": no parameters to compare")
    for i = 1, #got do H.close(got[i], finals[stage][i], 0, ("stage %d, parameter %d"):format(stage, i)) end
    -- and into a model of this job's ranks, with no optimizer
    local m2 = lt.models.gpt2("gpt2-tiny", { dropout = 0.1, generator = lt.Generator(8) })
    lt.ckpt.load(root() .. "/cut" .. stage .. "/ckpt/step_00000008", { model = m2, dist = true, world_size = w + 1 })
    H.close(m2:parameters()[1], finals[stage][1], 0, ("stage %d, parameter 1 (world size %d)"):format(stage, w + 1))
  end
end)


H.test("a ZeRO 1 checkpoint is refused by a ZeRO 3 job, naming both stages", function(r, w)
  local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(5) })
  local opt = lt.dist.Zero(m, { stage = 3, lr = 1e-3 })
  H.raises(function() lt.ckpt.load(root() .. "/cut1/ckpt/step_00000008", { model = m, opt = opt, dist = true }) end,
    "layout.zero is 1, this job's optimizer is ZeRO stage 3")
end)

H.test("resume = auto on every rank passes over a checkpoint whose last rank's optimizer file is corrupt", function(r, w)
  local ckpt = root() .. "/cut1/ckpt"
  local shard = ("%s/step_00000008/optimizer-rank%05d.safetensors"):format(ckpt, w - 1)
  if r == 0 then -- 4 bytes at its middle: the size stays
    local f = assert(io.open(shard, "r+b"))
    f:seek("set", math.floor(f:seek("end") / 2))
    f:write("\255\0\255\0")
    f:close()
  end
  lt.dist.barrier()
  local ok, why = lt.ckpt.verify(ckpt .. "/step_00000008")
  assert(not ok and why:find(shard .. ": its checksum is", 1, true), tostring(why))
  local _, b, summary = run(1, "cut1", 8, "auto")
  assert(summary.resumed_from == ckpt .. "/step_00000004", "resumed from " .. tostring(summary.resumed_from))
  for s = 5, 8 do assert(b[s] and b[s] == wholes[1][s], ("step %d: %s vs %s"):format(s, tostring(b[s]), tostring(wholes[1][s]))) end
  assert(lt.ckpt.verify(ckpt .. "/step_00000008"), "step 8 saved again, whole")
end)

-- (without the agreement the other ranks went on training and the job hung until the watchdog)
H.test("resume = auto stops on every rank when the ranks' checks of the files disagree", function(r, w)
  local real = lt.ckpt.newest_verified
  if r == w - 1 then lt.ckpt.newest_verified = function() return nil end end -- (as if its reads had failed)
  local ok, err = pcall(run, 1, "cut1", 8, "auto")
  lt.ckpt.newest_verified = real
  assert(not ok and tostring(err):find("the ranks found different checkpoints in " .. root() .. "/cut1/ckpt", 1, true),
    tostring(err))
end)

H.run("ckpt_spec")
if lt.dist.rank() == 0 and ROOT then os.execute("rm -rf " .. ROOT) end
