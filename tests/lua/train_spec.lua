-- tests/lua/train_spec.lua: lt.train: gradient accumulation equals one large
-- batch, the schedule advances per optimizer step (not on skipped steps),
-- non-finite losses stop or skip, metrics are written, bad settings fail
-- before training, sampling is reproducible; and lt.data.unigram_entropy.
local lt = require "lutra"
local H = require "tests.lua.helpers"

local OUT = os.tmpname() .. "-runs"

-- a loader over fixed batches
local function list_loader(batches)
  local i = 0
  return { next = function()
    i = i + 1
    local b = batches[i]
    if not b then return nil end
    return b[1], b[2]
  end }
end

local function tiny(seed)
  return lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(seed or 1) })
end

local function batches(n, B, T, seed)
  local g = lt.Generator(seed or 5)
  local out = {}
  for i = 1, n do
    local ids = lt.randint(0, 512, { B, T + 1 }, { generator = g })
    out[i] = { ids:narrow(2, 1, T):contiguous(), ids:narrow(2, 2, T):contiguous() }
  end
  return out
end

describe("lt.train", function()
  it("accumulating micro-batches gives one large batch's gradients and loss", function()
    local data = batches(2, 2, 16)
    -- ignore a few targets so the micro-batches count different numbers of tokens
    lt.no_grad(function() data[1][2]:narrow(2, 1, 5):fill_(-100) end)
    local m1, m2 = tiny(3), tiny(3)
    local o1 = lt.optim.SGD(m1, { lr = 0.1 })
    local o2 = lt.optim.SGD(m2, { lr = 0.1 })
    local s1 = lt.train { model = m1, optimizer = o1, train = list_loader(data), steps = 1, accum = 2, out_dir = OUT,
      quiet = true }
    local x = lt.cat({ data[1][1], data[2][1] }, 1)
    local y = lt.cat({ data[1][2], data[2][2] }, 1)
    local big = list_loader({ { x, y } })
    local s2 = lt.train { model = m2, optimizer = o2, train = big, steps = 1, out_dir = OUT, quiet = true }
    assert(math.abs(s1.loss - s2.loss) < 1e-5, ("losses %.7f and %.7f"):format(s1.loss, s2.loss))
    local p1, p2 = m1:parameters(), m2:parameters()
    for i = 1, #p1 do
      local d = (p1[i] - p2[i]):abs():max():item()
      assert(d < 1e-6, ("parameter %d differs by %g"):format(i, d))
    end
  end)

  it("computes the loss with the model's own loss method only where its class says it is the cross-entropy", function()
    local data = batches(1, 2, 16)
    -- lt.models' GPT-2 (the head and the loss as one op): the same step as F.cross_entropy of the logits
    local m1, m2 = tiny(4), tiny(4)
    local s1 = lt.train { model = m1, optimizer = lt.optim.SGD(m1, { lr = 0.1 }), train = list_loader(data), steps = 1,
      out_dir = OUT, quiet = true }
    local x, y = data[1][1], data[1][2]
    local l = lt.F.cross_entropy(m2(x), y)
    assert(math.abs(s1.loss - l:item()) < 1e-6, ("losses %.7f and %.7f"):format(s1.loss, l:item()))
    l:backward()
    lt.optim.SGD(m2, { lr = 0.1 }):step()
    local p1, p2 = m1:parameters(), m2:parameters()
    for i = 1, #p1 do assert((p1[i] - p2[i]):abs():max():item() < 1e-6, "parameter " .. i) end
    -- a user's model with a loss method of its own meaning (here a mean): not used
    local Sub = getmetatable(m1).class:extend("MeanLossGPT")
    function Sub:loss(idx, targets) return lt.F.cross_entropy(self(idx), targets) * 1000 end
    local m3, m4 = tiny(4), tiny(4)
    setmetatable(m3, Sub._meta)
    local s3 = lt.train { model = m3, optimizer = lt.optim.SGD(m3, { lr = 0.1 }), train = list_loader(data), steps = 1,
      out_dir = OUT, quiet = true }
    local s4 = lt.train { model = m4, optimizer = lt.optim.SGD(m4, { lr = 0.1 }), train = list_loader(data), steps = 1,
      out_dir = OUT, quiet = true }
    assert.are.equal(s4.loss, s3.loss)
  end)

  it("advances the schedule once per optimizer step and not on skipped steps", function()
    local seen = {}
    local sched = function(step)
      seen[#seen + 1] = step
      return 0.01
    end
    local data = batches(4, 2, 8)
    -- step 2's batch makes the loss infinite: a target outside... use a NaN weight instead
    local m = tiny(2)
    local o = lt.optim.SGD(m, { lr = 0.01 })
    local calls = 0
    local s = lt.train { model = m, optimizer = o, train = list_loader(data), steps = 4, accum = 1, schedule = sched,
      out_dir = OUT, quiet = true, skip_nonfinite = true,
      on_step = function(rec)
        calls = calls + 1
        if rec.step == 1 then -- poison the next step's loss
          lt.no_grad(function() m.transformer.wpe.weight:fill_(0 / 0) end)
        end
        if rec.step == 2 then
          lt.no_grad(function() m.transformer.wpe.weight:fill_(0) end)
        end
      end }
    assert.are.equal(4, calls)
    assert.are.equal(1, s.skipped)
    assert.are.equal(3, s.optimizer_steps)
    -- the check call at start asks for step 1; then steps 1, 2, 3 of the optimizer
    assert.are.same({ 1, 1, 2, 3 }, seen)
  end)

  it("clips through the optimizer's update (grad_scale): the steps of clipping the gradients in place", function()
    local data = batches(3, 2, 8)
    local runs = {}
    for _, folded in ipairs { true, false } do
      local m = tiny(6):to("f64")
      local o = lt.optim.AdamW(m, { lr = 1e-2, weight_decay = 0.1 })
      -- a wrapper whose step passes no options on: lt.train clips the gradients themselves
      if not folded then
        local inner = o
        o = setmetatable({ step = function() return inner:step() end }, { __index = inner })
      end
      local norms = {}
      lt.train { model = m, optimizer = o, train = list_loader(data), steps = 3, clip = 0.05, out_dir = OUT,
        quiet = true, on_step = function(rec) norms[#norms + 1] = rec.grad_norm end }
      runs[folded] = { m = m, norms = norms }
    end
    for i = 1, 3 do
      assert(runs[true].norms[i] > 0.05, "the clip applies at step " .. i)
      assert.are.equal(runs[false].norms[i], runs[true].norms[i], "the norm logged at step " .. i)
    end
    local pa, pb = runs[true].m:parameters(), runs[false].m:parameters()
    for i = 1, #pa do
      assert.are.same(pb[i]:totable(), pa[i]:totable(), "parameter " .. i .. " after 3 clipped steps")
    end
  end)

  it("stops on a non-finite loss with a message naming the step", function()
    local m = tiny(2)
    local o = lt.optim.SGD(m, { lr = 0.01 })
    lt.no_grad(function() m.transformer.wpe.weight:fill_(math.huge) end)
    H.assert_error(function()
      lt.train { model = m, optimizer = o, train = list_loader(batches(2, 2, 8)), steps = 2, out_dir = OUT, quiet = true }
    end, "step 1", "not finite")
  end)

  it("writes one JSON line per step, evaluation and sample", function()
    local tok = lt.tokenizer.load("data/gpt2.tiktoken")
    local m = tiny(4)
    local o = lt.optim.AdamW(m, { lr = 1e-3 })
    local name = "spec" .. tostring(os.time())
    local val = list_loader(batches(4, 2, 8, 9))
    lt.train { model = m, optimizer = o, train = list_loader(batches(2, 2, 8)), steps = 2, val = val, eval_every = 2,
      eval_batches = 2, sample_every = 2, sample = { tokenizer = tok, prompt = "a", tokens = 3 }, out_dir = OUT,
      name = name, quiet = true }
    local f = assert(io.open(OUT .. "/" .. name .. "/metrics.jsonl"))
    local lines = {}
    for line in f:lines() do lines[#lines + 1] = lt.json.decode(line) end
    f:close()
    assert.are.equal(6, #lines)
    -- a line that marks the run's start, the validation loss before training, then the steps
    assert.are.equal(name, lines[1].run)
    assert.are.equal(0, lines[1].start_step)
    table.remove(lines, 1)
    assert.are.equal(0, lines[1].step)
    assert(lines[1].val_loss > 0)
    table.remove(lines, 1)
    assert.are.equal(1, lines[1].step)
    assert(lines[1].loss > 0 and lines[1].tokens_per_s > 0 and lines[1].lr > 0 and lines[1].grad_norm > 0)
    assert(lines[3].val_loss > 0)
    assert(type(lines[4].sample) == "string" and lines[4].sample:sub(1, 1) == "a")
  end)

  it("records a sample holding a NUL byte (which JSON lines cannot hold as such) with U+2400 in its place", function()
    local gpt = lt.tokenizer.load("data/gpt2.tiktoken")
    local tok = { eot = gpt.eot, encode = function(_, t) return gpt:encode(t) end,
      decode = function(_, ids, o) return gpt:decode(ids, o) .. "\0!" end }
    local m = tiny(4)
    local name = "specnul" .. tostring(os.time())
    lt.train { model = m, optimizer = lt.optim.AdamW(m, { lr = 1e-3 }), train = list_loader(batches(1, 2, 8)), steps = 1,
      sample_every = 1, sample = { tokenizer = tok, prompt = "a", tokens = 2 }, out_dir = OUT, name = name, quiet = true }
    local f = assert(io.open(OUT .. "/" .. name .. "/metrics.jsonl"))
    local sample
    for line in f:lines() do sample = lt.json.decode(line).sample or sample end
    f:close()
    assert(sample and sample:sub(-4) == "\226\144\128!", "the sample's end: " .. tostring(sample and sample:sub(-4)))
  end)

  it("stops with an error naming the metrics file when a line cannot be written (a full disk)", function()
    local dir = OUT .. "/full"
    os.execute("mkdir -p " .. dir .. " && ln -sf /dev/full " .. dir .. "/metrics.jsonl")
    local m = tiny(4)
    local ok, err = pcall(lt.train, { model = m, optimizer = lt.optim.SGD(m, { lr = 0.1 }),
      train = list_loader(batches(2, 2, 8)), steps = 2, out_dir = OUT, name = "full", quiet = true })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("train: cannot write " .. dir .. "/metrics.jsonl: No space left on device", 1, true),
      tostring(err))
  end)

  it("rejects bad settings before training", function()
    local m = tiny(1)
    local o = lt.optim.SGD(m, { lr = 0.1 })
    local function run(extra)
      local s = { model = m, optimizer = o, train = list_loader(batches(1, 2, 8)), steps = 1, out_dir = OUT, quiet = true }
      for k, v in pairs(extra) do s[k] = v end
      return lt.train(s)
    end
    H.assert_error(function() run { stepz = 3 } end, "unknown setting", "stepz", "did you mean 'steps'?")
    H.assert_error(function() run { accum = 0 } end, "accum", ">= 1")
    H.assert_error(function() run { steps = 0 } end, "steps", ">= 1")
    H.assert_error(function() run { eval_every = 5 } end, "val loader")
    H.assert_error(function() run { train = list_loader(batches(1, 1, 65)) } end, "sequence length 65", "block_size 64")
    H.assert_error(function() run { train = list_loader({}) } end, "no batch")
    local zero = lt.optim.SGD(tiny(1), { lr = 0 })
    H.assert_error(function() run { optimizer = zero } end, "learning rate must be > 0")
  end)

  it("samples greedily at temperature 0, and checks sample, evaluation and checkpoint settings before the first step", function()
    local tok = lt.tokenizer.load("data/gpt2.tiktoken")
    local m = tiny(4)
    local o = lt.optim.SGD(m, { lr = 0.01 })
    local texts, steps_run = {}, 0
    local function run(extra, train)
      steps_run = 0
      local s = { model = m, optimizer = o, train = train or list_loader(batches(2, 2, 8)), steps = 2, out_dir = OUT,
        quiet = true, sample_every = 1, sample = { tokenizer = tok, prompt = "a", tokens = 4, temperature = 0 },
        on_step = function() steps_run = steps_run + 1 end }
      for k, v in pairs(extra) do s[k] = v end
      return lt.train(s)
    end
    -- temperature 0 is greedy, as for lt.generate: the sample is the most likely continuation
    run { name = "greedy" }
    local f = assert(io.open(OUT .. "/greedy/metrics.jsonl"))
    for line in f:lines() do
      local r = lt.json.decode(line)
      if r.sample then texts[#texts + 1] = r.sample end
    end
    f:close()
    assert.are.equal(2, #texts)
    local want = lt.generate(m, tok:encode("a"), { max_tokens = 4, temperature = 0 })
    assert.are.equal(tok:decode(tok:encode("a")) .. tok:decode(want), texts[2])
    -- settings that would fail at the first sample, evaluation or save fail before any step
    local function refused(extra, train, ...)
      H.assert_error(function() run(extra, train) end, ...)
      assert.are.equal(0, steps_run, "steps run before the error")
    end
    local function sample(t)
      local s = { tokenizer = tok, prompt = "a", tokens = 4 }
      for k, v in pairs(t) do s[k] = v end
      return { sample = s }
    end
    refused(sample { temperature = -1 }, nil, "train: sample: temperature must be a number in [0, inf]")
    refused(sample { top_p = 0 }, nil, "top_p must be > 0")
    refused(sample { top_k = 1.5 }, nil, "top_k and max_tokens must be whole numbers")
    refused(sample { tokens = 0 }, nil, "sample.tokens must be a whole number >= 1")
    refused(sample { temprature = 0.5 }, nil, "unknown sample setting 'temprature' (did you mean 'temperature'?)")
    -- (GPT-2's id for " Hello" lies outside gpt2-tiny's 512)
    refused(sample { prompt = " Hello" }, nil, "prompt token 1 is 18435, outside the vocabulary [0, 512)")
    local long = batches(1, 1, 65)
    local val = { next = function() return long[1][1], long[1][2] end, state = function() return 0 end,
      load_state = function() end }
    refused({ val = val, eval_every = 1 }, nil, "validation batches' sequence length 65", "block_size 64")
    local stateful = list_loader(batches(2, 2, 8))
    stateful.state, stateful.load_state = function() return {} end, function() end
    refused({ ckpt_every = 1, ckpt_dir = "/proc/no-such/ckpt" }, stateful, "cannot create the directory /proc/no-such/ckpt")
  end)

  it("prints the first step, means over the log interval, a validation loss before training, time left and peak memory", function()
    local m = tiny(5)
    local o = lt.optim.AdamW(m, { lr = 1e-3 })
    local lines, losses = {}, {}
    local print0, threads = print, lt.num_threads()
    lt.set_num_threads(1)
    _G.print = function(line) lines[#lines + 1] = line end
    local ok, err = pcall(lt.train, { model = m, optimizer = o, train = list_loader(batches(7, 2, 8)), steps = 7,
      log_every = 5, val = list_loader(batches(8, 2, 8, 9)), eval_every = 5, eval_batches = 1, out_dir = OUT,
      name = "log", on_step = function(rec) losses[rec.step] = rec.loss end })
    _G.print = print0
    lt.set_num_threads(threads)
    assert(ok, err)
    local text = table.concat(lines, "\n")
    assert.truthy(text:find("(1 core x 2.5 GHz", 1, true), text)
    local steps = {}
    for _, l in ipairs(lines) do
      local step = tonumber(l:match("^step +(%d+)/7 | loss"))
      if step then steps[#steps + 1] = step end
    end
    assert.are.same({ 1, 5, 7 }, steps) -- the first step, every log_every-th and the last
    assert.truthy(text:find("step     0/7 | val loss [%d.]+ %(before training%)\nstep     1/7 | loss"), text)
    local function mean(a, b)
      local sum = 0
      for i = a, b do sum = sum + losses[i] end
      return sum / (b - a + 1)
    end
    for _, want in ipairs { { 1, 1, 1 }, { 5, 2, 5 }, { 7, 6, 7 } } do
      local pattern = ("step +%d/7 | loss [%%d.]+ | mean%%(%d%%) %.4f |"):format(want[1], want[3] - want[2] + 1,
        mean(want[2], want[3]))
      assert.truthy(text:find(pattern), pattern .. "\n" .. text)
    end
    assert.truthy(text:find("| mem [%d.]+ MiB, peak [%d.]+ MiB | 0:%d%d, ETA 0:%d%d"), text)
    assert.truthy(text:find("step     7/7 |[^\n]+ETA 0:00"), text)
  end)

  it("trains in bf16 with f32 master weights and state", function()
    local m = tiny(8):to("bf16")
    local o = lt.optim.AdamW(m, { lr = 3e-3 })
    local data = batches(1, 4, 32, 3)
    local repeated = {}
    for i = 1, 12 do repeated[i] = data[1] end -- one batch again and again: the loss must fall
    local losses = {}
    lt.train { model = m, optimizer = o, train = list_loader(repeated), steps = 12, out_dir = OUT, quiet = true,
      on_step = function(rec) losses[#losses + 1] = rec.loss end }
    assert(losses[12] < losses[1] - 0.5, ("bf16 loss %.3f -> %.3f"):format(losses[1], losses[12]))
    for _, p in ipairs(m:parameters()) do
      assert.are.equal("bf16", p.dtype)
      local st = o.state[p]
      assert.are.equal("f32", st.master.dtype)
      assert.are.equal("f32", st.exp_avg.dtype)
    end
  end)

  it("samples reproducibly from a seed", function()
    local m = tiny(6)
    local a = lt.train.generate(m, { 1, 2, 3 }, { tokens = 5, generator = lt.Generator(7) })
    local b = lt.train.generate(m, { 1, 2, 3 }, { tokens = 5, generator = lt.Generator(7) })
    assert.are.same(a, b)
    assert.are.equal(8, #a)
    for i = 4, 8 do assert(a[i] >= 0 and a[i] < 512) end
    H.assert_error(function() lt.train.generate(m, {}, {}) end, "prompt token")
  end)
end)

describe("lt.data.unigram_entropy", function()
  it("is the validation cross-entropy under smoothed training frequencies", function()
    local dir = os.tmpname() .. "-uni"
    os.execute("mkdir -p " .. dir)
    lt.data.write_shard(dir .. "/train_000000.bin", lt.tensor({ 1, 1, 1, 2 }, "i32"), 4)
    lt.data.write_shard(dir .. "/val_000000.bin", lt.tensor({ 1, 3 }, "i32"), 4)
    local h, nt, nv = lt.data.unigram_entropy(dir .. "/train", dir .. "/val", 4)
    -- counts + 1 over N + V = 8: p(1) = 4/8, p(3) = 1/8
    local want = -(math.log(4 / 8) + math.log(1 / 8)) / 2
    assert(math.abs(h - want) < 1e-12, h)
    assert.are.equal(4, nt)
    assert.are.equal(2, nv)
    assert.are.same({ 1, 1, 1, 2 }, lt.data.read_shard(dir .. "/train_000000.bin"):totable())
    H.assert_error(function() lt.data.unigram_entropy(dir .. "/train", dir .. "/val", 2) end, "outside the vocabulary")
    local loader = lt.data.shards { path = dir .. "/train", batch = 1, seq = 2 }
    H.assert_error(function() lt.data.unigram_entropy(loader, dir .. "/val", 4) end, "the shards' paths", "not a loader")
    H.assert_error(function() lt.data.read_shard(dir .. "/nope.bin") end, "nope.bin")
    os.execute("rm -rf " .. dir)
  end)
end)
