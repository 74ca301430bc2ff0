-- tests/lua/train_parts_spec.lua: lt.train's parts used on their own: a
-- hand-written loop with lt.train.step and a micro-batch function of its
-- own gives lt.train's losses and gradient norms bit for bit;
-- lt.train.evaluate gives its validation loss; lt.train.checkpoint saves and
-- resumes a custom loop as lt.train does; lt.train.log writes metrics lines.
local lt = require "lutra"

local OUT = os.tmpname() .. "-parts"

local function tiny(seed)
  return lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(seed or 1) })
end

-- fixed batches, some targets ignored (the micro-batches count different numbers of tokens)
local function batches(n, B, T, seed)
  local g = lt.Generator(seed or 5)
  local out = {}
  for i = 1, n do
    local ids = lt.randint(0, 512, { B, T + 1 }, { generator = g })
    out[i] = { ids:narrow(2, 1, T):contiguous(), ids:narrow(2, 2, T):contiguous() }
  end
  lt.no_grad(function() out[1][2]:narrow(2, 1, 5):fill_(-100) end)
  return out
end

-- a loader over fixed batches, with a state (for checkpoints)
local function loader(data)
  local i = 0
  return {
    next = function()
      i = i + 1
      local b = data[i]
      if not b then return nil end
      return b[1], b[2]
    end,
    state = function() return { epoch = 0, index = i } end,
    load_state = function(_, s) i = s.index end,
  }
end

local SCHEDULE = lt.optim.schedules.cosine { lr = 1e-3, warmup = 2, steps = 6 }

-- lt.train's losses and gradient norms, step by step
local function reference(data, steps, extra)
  local m = tiny(3)
  local losses, norms = {}, {}
  local o = { model = m, optimizer = lt.optim.AdamW(m, { lr = 1e-3 }), train = loader(data), steps = steps, accum = 2,
    clip = 0.5, schedule = SCHEDULE, quiet = true, out_dir = OUT, name = "reference",
    on_step = function(r) losses[r.step], norms[r.step] = r.loss, r.grad_norm end }
  for k, v in pairs(extra or {}) do o[k] = v end
  local summary = lt.train(o)
  return losses, norms, summary
end

-- a micro-batch function of one's own: what a pipeline schedule would replace
local function my_micro_batches(s, xs, ys, total)
  local sum, tokens = 0, 0
  for k = 1, #xs do
    local l = s.model:loss(xs[k], ys[k], { reduction = "sum", ignore_index = -100, count = false })
    if total > 0 then (l / total):backward() end
    sum = sum + l:item()
    tokens = tokens + xs[k]:numel()
  end
  return sum, tokens
end

describe("lt.train's parts", function()
  after_each(function() os.execute("rm -rf '" .. OUT .. "'") end)

  it("a hand-written loop with lt.train.step and its own micro-batches gives lt.train's losses bit for bit", function()
    local data = batches(12, 2, 16)
    local want_losses, want_norms = reference(data, 6)
    local m = tiny(3)
    local S = lt.train.step.new { model = m, optimizer = lt.optim.AdamW(m, { lr = 1e-3 }), accum = 2, clip = 0.5,
      schedule = SCHEDULE, micro_batches = my_micro_batches }
    local l = loader(data)
    for step = 1, 6 do
      local r = S:run(step, function() return l:next() end)
      assert.are.equal(want_losses[step], r.loss)
      assert.are.equal(want_norms[step], r.grad_norm)
      assert.are.equal(SCHEDULE(step), r.lr)
      assert.is_true(r.finite)
      assert.are.equal(2 * 2 * 16, r.tokens)
    end
    assert.are.equal(6, S.optimizer_steps)
    -- and the default micro-batch loop gives the same
    local m2 = tiny(3)
    local S2 = lt.train.step.new { model = m2, optimizer = lt.optim.AdamW(m2, { lr = 1e-3 }), accum = 2, clip = 0.5,
      schedule = SCHEDULE }
    local l2 = loader(data)
    for step = 1, 6 do assert.are.equal(want_losses[step], S2:run(step, function() return l2:next() end).loss) end
  end)

  it("lt.train.step raises on a step that is not finite, or skips it", function()
    local data = batches(2, 2, 16)
    local m = tiny(3)
    local S = lt.train.step.new { model = m, optimizer = lt.optim.SGD(m, { lr = 1e-3 }),
      micro_batches = function() return 0 / 0, 32 end }
    local l = loader(data)
    local ok, err = pcall(S.run, S, 7, function() return l:next() end)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("train: step 7: the loss is not finite", 1, true), tostring(err))
    S.skip_nonfinite = true
    local r = S:run(8, function() return l:next() end)
    assert.is_false(r.finite)
    assert.are.equal(1, S.skipped)
    assert.are.equal(0, S.optimizer_steps)
    assert.has_error(function() lt.train.step.new { model = m } end)
    assert.has_error(function() lt.train.step.new { model = m, optimizer = S.optimizer, accum = 0 } end)
  end)

  it("lt.train.evaluate gives lt.train's validation loss", function()
    local data, vdata = batches(6, 2, 16), batches(3, 2, 16, 9)
    local _, _, summary = reference(data, 3, { val = loader(vdata), eval_every = 3, eval_batches = 3 })
    -- the same model trained by hand, then evaluated
    local m = tiny(3)
    local S = lt.train.step.new { model = m, optimizer = lt.optim.AdamW(m, { lr = 1e-3 }), accum = 2, clip = 0.5,
      schedule = SCHEDULE }
    local l = loader(data)
    for step = 1, 3 do S:run(step, function() return l:next() end) end
    assert.are.equal(summary.val_loss, lt.train.evaluate(m, loader(vdata), { batches = 3 }))
    assert.is_true(m.training)
  end)

  it("lt.train.checkpoint saves and resumes a custom loop, continuing as lt.train does", function()
    local data = batches(12, 2, 16)
    local want = reference(data, 6)
    local dir = OUT .. "/custom/ckpt"
    local function loop(first, last)
      local m = tiny(3)
      local opt = lt.optim.AdamW(m, { lr = 1e-3 })
      local l = loader(data)
      local rng = { default = lt.default_generator() }
      local r = lt.train.checkpoint.resume { dir = dir, mode = "auto", model = m, optimizer = opt, loader = l, rng = rng,
        steps = last }
      assert.are.equal(first - 1, r.start_step)
      local S = lt.train.step.new { model = m, optimizer = opt, accum = 2, clip = 0.5, schedule = SCHEDULE,
        optimizer_steps = r.optimizer_steps }
      local got = {}
      for step = r.start_step + 1, last do
        got[step] = S:run(step, function() return l:next() end).loss
        local path, stop = lt.train.checkpoint.save { dir = dir, model = m, optimizer = opt, loader = l, rng = rng,
          step = step, optimizer_steps = S.optimizer_steps, keep_last = 1 }
        assert.truthy(lt.ckpt.verify(path))
        assert.is_false(stop)
      end
      return got
    end
    local a = loop(1, 3)
    local b = loop(4, 6)
    for step = 1, 3 do assert.are.equal(want[step], a[step]) end
    for step = 4, 6 do assert.are.equal(want[step], b[step]) end
    assert.are.equal(1, #lt.ckpt.list(dir))
  end)

  it("lt.train.log writes metrics lines and formats lt.train's step line", function()
    local log = lt.train.log.open { dir = OUT .. "/logged", quiet = true }
    log:record { step = 1, loss = 2.5, grad_norm = 0 / 0 }
    log:say("not printed: quiet")
    assert.is_true(log:close())
    local f = assert(io.open(OUT .. "/logged/metrics.jsonl"))
    local line = f:read("*l")
    f:close()
    local t = lt.json.decode(line)
    assert.are.equal(2.5, t.loss)
    assert.are.equal("nan", t.grad_norm)
    local text = lt.train.log.step_line { step = 3, steps = 10, loss = 1.5, mean = 1.75, mean_steps = 2, lr = 1e-3,
      grad_norm = 0.5, ms = 12, tokens_per_s = 1000, mem = 2 ^ 20, mem_peak = 2 ^ 31, elapsed_s = 65, eta_s = 3725 }
    assert.are.equal("step     3/10 | loss 1.5000 | mean(2) 1.7500 | lr 1.00e-03 | norm 0.500 |     12 ms |    1000 tok/s"
      .. " | MFU n/a | mem 1.0 MiB, peak 2.00 GiB | 1:05, ETA 1:02:05", text)
    assert.are.equal(lt.train.format_bytes, lt.train.log.format_bytes)
  end)
end)
