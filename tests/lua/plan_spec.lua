-- tests/lua/plan_spec.lua: the planner (lt.plan, recipes/plan.lua) in
-- one process: the parameters it lists are the models' own (names,
-- shapes, counts; lutra names, recipe flags and Hugging Face configs); its
-- state bytes are lt.dist.memory_bytes' after a step; the allocator size
-- classes; the pipeline's in-flight formulas against the schedules'
-- simulation; the step-time model's own identities (MFU equals the
-- assumed one with nothing to wait for, the bubble, ring and tree); the
-- guide's 175B-on-384-H100 arithmetic (cost and power); the sanity check
-- of claimed efficiencies; the search; and bad input, named. (Whole steps
-- measured against the predictions, each layout in a fresh job:
-- recipes/plan.lua --measure --check in tests/dist/run.sh.)
local lt = require "lutra"
local H = require "tests.lua.helpers"
local plan = lt.plan
local shapes, memory, timing = plan.shapes, plan.memory, plan.time

local function cpu(t)
  t.device, t.dtype = t.device or "cpu", t.dtype or "f32"
  return plan.layout(t)
end

local function model_of(d)
  local cfg = {}
  for k, v in pairs(d.config) do cfg[k] = v end
  cfg.generator = lt.Generator(1)
  return lt.models[d.family](cfg)
end

local function same_parameters(d, model)
  local want, n = {}, 0
  for _, np in ipairs(model:named_parameters()) do
    want[np[1]], n = table.concat(np[2]:shape(), "x"), n + 1
  end
  local list = shapes.parameters(d, 1)
  for _, p in ipairs(list) do
    assert.are.equal(want[p.name], table.concat(p.shape, "x"), p.name)
  end
  assert.are.equal(n, #list)
  assert.are.equal(model:num_parameters(), shapes.num_parameters(d))
end

describe("lt.plan: models", function()
  it("lists the parameters lutra's models hold, name by name, for GPT-2 and Llama configs", function()
    for _, c in ipairs {
      { "gpt2", { n_layer = 2, n_head = 4, n_embd = 32, block_size = 16, vocab_size = 101 } },
      { "gpt2", { n_layer = 2, n_head = 4, n_embd = 32, block_size = 16, vocab_size = 101, pad_vocab = 64 } },
      { "gpt2", { n_layer = 1, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 50, tie_embeddings = false } },
      { "llama", { dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 64, vocab_size = 99, max_seq_len = 16 } },
      { "llama", { dim = 32, n_layers = 1, n_heads = 4, n_kv_heads = 4, ffn_dim = 48, vocab_size = 99, max_seq_len = 16,
        tie_embeddings = true } },
    } do
      local d = shapes.describe(c[1], c[2])
      same_parameters(d, model_of(d))
    end
  end)

  it("knows the published sizes: GPT-2 124M, GPT-3 175B, Llama 2 70B", function()
    assert.are.equal(124439808, shapes.num_parameters(plan.model("gpt2")))
    assert.are.equal(68976648192, shapes.num_parameters(plan.model("llama2-70b")))
    local n = shapes.num_parameters(plan.model("gpt3-175b"))
    assert(n > 174.5e9 and n < 174.7e9, n)
  end)

  it("reads recipes/gpt2.lua's flags (its Llama defaults too) and Hugging Face config.json files", function()
    local d = plan.model { model = "llama", n_layer = 2, n_head = 6, n_embd = 48, seq = 16 }
    assert.are.equal(3, d.n_kv_head) -- (n_head / 2)
    assert.are.equal(128, d.ffn) -- (8/3 x 48 rounded up to 64)
    same_parameters(d, model_of(d))
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    local f = assert(io.open(dir .. "/config.json", "w"))
    f:write([[{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
      "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 321,
      "max_position_embeddings": 64, "tie_word_embeddings": false}]])
    f:close()
    for _, path in ipairs { dir .. "/config.json", dir } do
      local h = plan.model(path)
      assert.are.equal("llama", h.family)
      assert.are.equal(2, h.n_kv_head)
      same_parameters(h, model_of(h))
    end
    f = assert(io.open(dir .. "/config.json", "w"))
    f:write([[{"architectures": ["MambaForCausalLM"], "hidden_size": 64}]])
    f:close()
    H.assert_error(function() plan.model(dir .. "/config.json") end, "MambaForCausalLM")
    os.execute("rm -rf " .. dir)
    H.assert_error(function() plan.model("gpt5") end, "unknown model gpt5", "llama2-70b")
  end)
end)

describe("lt.plan: memory", function()
  it("rounds each tensor to lutra's allocator size classes", function()
    assert.are.equal(64, memory.round(1))
    assert.are.equal(4096, memory.round(4096))
    assert.are.equal(5120, memory.round(4097)) -- (4 KiB + a quarter)
    assert.are.equal(10240, memory.round(8193))
    assert.are.equal(2 ^ 20 + 2 ^ 18, memory.round(2 ^ 20 + 1))
    assert.are.equal(2 ^ 21, memory.round(2 ^ 21))
    assert.are.equal(512, memory.round(100, "cuda"))
  end)

  it("predicts lt.dist.memory_bytes after a step exactly, f32 and bf16 weights", function()
    for _, dtype in ipairs { "f32", "bf16" } do
      local d = shapes.describe("gpt2", { n_layer = 2, n_head = 4, n_embd = 32, block_size = 16, vocab_size = 101 })
      local model = model_of(d)
      model:to("cpu", dtype)
      local opt = lt.optim.AdamW(model, { lr = 1e-3 })
      local x = lt.randint(0, 101, { 2, 9 }, { generator = lt.Generator(2), dtype = "i64" })
      local S = lt.train.step.new { model = model, optimizer = opt }
      S:run(1, function() return x:narrow(2, 1, 8):contiguous(), x:narrow(2, 2, 8):contiguous() end)
      local got = lt.dist.memory_bytes(model, opt)
      local want = plan.state.bytes(d, cpu { dtype = dtype })
      for _, k in ipairs { "params", "grads", "optimizer" } do
        assert(got[k] == want[k], ("%s %s: lt.dist.memory_bytes %d, the planner %d"):format(dtype, k, got[k], want[k]))
      end
    end
  end)

  it("counts the pipeline's micro-batches in flight as the schedules' simulation does", function()
    for p = 2, 5 do
      for m = p, 2 * p + 3 do
        for _, v in ipairs(m % p == 0 and { 1, 2, 3 } or { 1 }) do
          for s = 0, p - 1 do
            local L = cpu { pp = p, v = v, micro_batches = m }
            assert.are.equal(memory.schedule_in_flight(L, s), memory.in_flight_formula(L, s),
              ("p %d m %d v %d stage %d"):format(p, m, v, s))
          end
        end
      end
    end
  end)

  it("keeps less with recomputation, and says when a layout does not fit", function()
    local d = plan.model("gpt2")
    local L = plan.layout { micro_batch = 8 }
    local none = memory.block_bytes(d, L, "none")
    assert(memory.block_bytes(d, L, "full") < 0.15 * none)
    assert(memory.block_bytes(d, L, "selective") < none)
    local function acts(rc) return memory.estimate(d, plan.layout { micro_batch = 8, recompute = rc }).activations end
    assert(acts("full") < 0.5 * acts("none"))
    local r = plan.estimate(plan.model("llama2-70b"), plan.layout { micro_batch = 1, seq = 4096 },
      { gpu = "h100", gpus = 1 })
    assert.is_false(r.fits)
    assert(r.problems[1]:find("memory: ", 1, true), r.problems[1])
  end)
end)

describe("lt.plan: time, cost and sanity", function()
  local h100 = plan.cluster { gpu = "h100", gpus = 1 }

  it("gives the assumed MFU when there is nothing to wait for, and the bubble of a pipeline", function()
    local d = plan.model("gpt2")
    local t = timing.estimate(d, plan.layout { micro_batch = 8 }, h100.gpu, { mfu = 0.37 })
    assert(math.abs(t.mfu - 0.37) < 1e-12, t.mfu)
    assert.are.equal(lt.train.log.transformer_flops(124439808, 12, 768, 1024), t.flops_per_token)
    local L = plan.layout { pp = 4, micro_batches = 12, v = 2 }
    assert.are.equal(3 / (2 * 12 + 3), timing.estimate(d, L, h100.gpu).bubble)
    -- ring wins on large messages, the tree on small ones
    local big, small = 1e9, 1e3
    assert(timing.all_reduce(big, 64, 50e9, 1e-5) < 2 * big / 50e9 + 1e-3)
    assert(timing.all_reduce(small, 64, 50e9, 1e-5) < 2 * 63 * 1e-5)
    -- a claimed step time's implied MFU is the step's FLOPs over the peak
    local Lb = plan.layout { micro_batch = 8, global_batch = 64 }
    assert(math.abs(timing.implied_mfu(d, Lb, h100.gpu, 2) - t.flops_per_token * 64 * 1024 / (2 * 989.4e12)) < 1e-12)
  end)

  it("reproduces the guide's 175B on 384 H100 arithmetic: $2,280,960 a month; 700 kW only with servers and cooling", function()
    local c = plan.cluster { gpu = "h100", gpus = 384 }
    local k = plan.cost(30 * 86400, 384, c, { price = 8.25, kwh_price = 0.15, pue = 1.4 })
    assert.are.equal(276480, k.gpu_hours)
    assert.are.equal(2280960, k.dollars)
    assert.are.equal("2,280,960", plan.money(k.dollars))
    assert(math.abs(k.gpu_kw - 268.8) < 1e-9) -- (the GPUs alone at 700 W)
    assert(math.abs(k.server_kw - 489.6) < 1e-9) -- (DGX H100: 10.2 kW a server of 8)
    assert(math.abs(k.facility_kw - 685.44) < 1e-9)
    assert(math.abs(k.power_dollars - 685.44 * 720 * 0.15) < 1e-6)
  end)

  it("flags an efficiency above what is published, and a step time implying one", function()
    local d = plan.model("gpt3-175b")
    local L = plan.layout { dp = 6, tp = 8, pp = 8, zero = 1, micro_batch = 1, global_batch = 1536, seq = 2048 }
    local r = plan.estimate(d, L, { gpu = "h100", gpus = 384 })
    assert.is_true(r.ok)
    local lines = plan.sanity(r, { claim_mfu = 0.78, claim_step_s = 5 })
    assert(lines[1]:find("78.0% is above any published MFU at scale", 1, true), lines[1])
    assert(lines[2]:find("a claimed step of 5.00 s", 1, true) and lines[2]:find("above any published", 1, true), lines[2])
    assert(plan.sanity(r, { claim_mfu = 0.45 })[1]:find("within what is published", 1, true))
    local text = plan.report(r, { days = 30, price = 8.25, kwh_price = 0.15, claim_mfu = 0.78 })
    for _, part in ipairs { "memory per GPU", "optimizer state", "step time", "MFU", "$2,280,960", "685.4 kW" } do
      assert(text:find(part, 1, true), part .. " missing from the report:\n" .. text)
    end
  end)

  it("searches the layouts that fit, fastest first, and counts why the others do not", function()
    local fits, reasons = plan.search(plan.model("gpt2-medium"), { gpu = "a100", gpus = 8 },
      { global_batch = 64, seq = 1024 })
    assert(#fits > 10)
    for i = 2, #fits do assert(fits[i - 1].time.tokens_per_s >= fits[i].time.tokens_per_s) end
    for _, r in ipairs(fits) do assert(r.fits and r.layout.ranks == 8 and r.layout.global_batch == 64) end
    local why = {}
    for _, x in ipairs(reasons) do why[#why + 1] = x.why end
    why = table.concat(why, "; ")
    assert(why:find("ZeRO 3 with a pipeline", 1, true), why)
    assert(why:find("global batch", 1, true), why)
    assert(plan.search_report(fits, reasons, 3):find("layouts fit", 1, true))
  end)
end)

describe("lt.plan: bad input", function()
  it("names what is wrong in a layout, a model or a GPU", function()
    H.assert_error(function() plan.layout { dp = 3, micro_batch = 2, global_batch = 10 } end,
      "global batch 10 is not a multiple of micro_batch 2 x dp 3")
    H.assert_error(function() plan.layout { pp = 2, zero = 3 } end, "ZeRO stage 3 with pipeline parallelism")
    H.assert_error(function() plan.layout { sp = true } end, "sequence parallelism (sp) needs tp > 1")
    H.assert_error(function() plan.layout { v = 2, schedule = "1f1b" } end, "needs the interleaved schedule")
    H.assert_error(function() plan.layout { tensor = 2 } end, "unknown layout setting tensor")
    H.assert_error(function() plan.layout { recompute = "most" } end, "recompute must be none, full")
    H.assert_error(function() plan.cluster { gpu = "b300" } end, "unknown GPU b300", "h100, h200")
    H.assert_error(function() shapes.parameters(plan.model("gpt2"), 5) end, "12 heads do not divide by tp 5")
    local r = plan.estimate(plan.model("gpt2"), plan.layout { tp = 8, dp = 2 }, { gpu = "h100", gpus = 8 })
    assert.is_false(r.ok)
    assert(r.problems[1]:find("16 ranks, the cluster has 8 GPUs", 1, true), r.problems[1])
  end)

  it("recipes/plan.lua: a bad setting is one line naming it, and exits 1", function()
    for _, c in ipairs {
      { "--model=gpt5", "unknown model gpt5" },
      { "--gpu=tpu", "unknown GPU tpu" },
      { "--gpus=4 --tp=8", "--tp=8 x --pp=1 is more than --gpus=4" },
      { "--search", "--search needs --global_batch" },
      { "--gpus=4 --global_batch=6", "global batch 6 is not a multiple of micro_batch 1 x dp 4" },
      { "--measure", "--measure runs the layout on this machine" },
    } do
      local p = io.popen("./lutra recipes/plan.lua " .. c[1] .. " 2>&1; echo rc=$?")
      local out = p:read("*a")
      p:close()
      assert(out:find(c[2], 1, true), c[1] .. ": " .. out)
      assert(out:find("rc=1", 1, true) and not out:find("traceback", 1, true), c[1] .. ": " .. out)
    end
  end)
end)
