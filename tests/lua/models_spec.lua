-- tests/lua/models_spec.lua: GPT-2 and Llama against PyTorch. The same tiny
-- models, built in PyTorch from fixed weights (tests/ref/gen_models.py),
-- give logits, a loss and every parameter's gradient; lutra loads the
-- weights by their Hugging Face names and must match: loss to 1e-5 relative,
-- logits and each gradient to 1e-4 relative (f32). Also the nn.Module API.
local lt = require "lutra"
local H = require "tests.lua.helpers"

--- max |a - b| / max |b| over all elements.
local function rel_err(a, b)
  local diff = (a:to("f64") - b:to("f64")):abs():max():item()
  local scale = b:to("f64"):abs():max():item()
  return diff / math.max(scale, 1e-30)
end

local function check_against(file, build)
  local ref, meta = lt.load(file)
  local cfg = lt.json.decode(meta.config)
  local model = build(cfg)
  local sd = {}
  for k, v in pairs(ref) do
    local name = k:match("^param%.(.*)$")
    if name then sd[name] = v end
  end
  model:load_state_dict(sd)
  local logits = model(ref["input.idx"])
  assert.is_true(rel_err(logits, ref.logits) < 1e-4, "logits " .. rel_err(logits, ref.logits))
  local loss, n = lt.F.cross_entropy(logits, ref["input.targets"])
  assert.are.equal(ref["input.targets"]:numel() - 1, n) -- one ignored target
  local want = ref.loss:item()
  assert.is_true(math.abs(loss:item() - want) / want < 1e-5, ("loss %.9g vs %.9g"):format(loss:item(), want))
  loss:backward()
  local checked = 0
  for _, np in ipairs(model:named_parameters()) do
    local g = ref["grad." .. np[1]]
    assert.truthy(g, "no reference gradient for " .. np[1])
    assert.truthy(np[2].grad, "no gradient for " .. np[1])
    local e = rel_err(np[2].grad, g)
    assert.is_true(e < 1e-4, ("gradient of %s: relative error %.3g"):format(np[1], e))
    checked = checked + 1
  end
  return checked
end

describe("models against PyTorch", function()
  it("GPT-2 (tied embedding, tanh GELU) matches logits, loss and every gradient", function()
    local n = check_against("tests/ref/gpt2_tiny.safetensors", function(cfg) return lt.models.gpt2(cfg) end)
    assert.are.equal(2 + 2 + 12 * 2, n) -- wte, wpe, ln_f (2), 12 per block; lm_head is wte
  end)
  it("Llama (RMSNorm, RoPE, SwiGLU, grouped-query attention) matches too", function()
    local n = check_against("tests/ref/llama_tiny.safetensors", function(cfg) return lt.models.llama(cfg) end)
    assert.are.equal(3 + 9 * 2, n)
  end)
end)

describe("GPT-2 and Llama shapes", function()
  it("gpt2 has exactly 124,439,808 parameters; names and init follow GPT-2", function()
    assert.are.equal(124439808, lt.models.gpt2("gpt2"):num_parameters())
    local m = lt.models.gpt2("gpt2-tiny", { generator = lt.Generator(1) })
    assert.are.equal(m.transformer.wte.weight, m.lm_head.weight)
    local names = {}
    for _, np in ipairs(m:named_parameters()) do names[np[1]] = np[2] end
    assert.truthy(names["transformer.h.1.mlp.c_proj.weight"])
    assert.is_nil(names["lm_head.weight"]) -- tied: stored once, under wte
    local std = names["transformer.h.0.attn.c_proj.weight"]:std():item()
    assert.is_true(math.abs(std - 0.02 / math.sqrt(4)) < 0.003)
    assert.are.equal(0, names["transformer.h.0.attn.c_attn.bias"]:abs():sum():item())
    local padded = lt.models.gpt2("gpt2-tiny", { vocab_size = 500, pad_vocab = 64 })
    assert.are.same({ 512, 64 }, padded.transformer.wte.weight:shape())
    assert.are.same({ 1, 3, 500 }, padded(lt.tensor({ { 1, 2, 3 } }, "i64")):shape())
    -- the loss reads the padded head's logits (classes = 500): the narrowed logits' loss and gradients
    local idx, tgt = lt.tensor({ { 1, 2, 3, 499 } }, "i64"), lt.tensor({ { 2, 3, 499, 7 } }, "i64")
    local la, n = padded:loss(idx, tgt)
    assert.are.equal(4, n)
    la:backward()
    local ga = padded.transformer.wte.weight.grad:clone()
    padded:zero_grad()
    local lb = lt.F.cross_entropy(padded(idx), tgt)
    lb:backward()
    assert.is_true(math.abs(la:item() - lb:item()) <= 1e-6 * math.abs(lb:item()))
    assert.is_true((ga - padded.transformer.wte.weight.grad):abs():max():item() <= 1e-6)
    assert.are.same({ 1, 4, 512 }, padded(idx, nil, true):shape())
  end)
  it("a model's own config (padded vocabulary and all) builds the same model again", function()
    for _, make in ipairs { lt.models.gpt2, lt.models.llama } do
      local a = make(make == lt.models.gpt2 and "gpt2-tiny" or "llama-tiny",
        { vocab_size = 97, pad_vocab = 64, generator = lt.Generator(3) })
      assert.are.equal(128, a.config.padded_vocab_size)
      local cfg = {}
      for k, v in pairs(a.config) do cfg[k] = v end
      cfg.generator = lt.Generator(3)
      local b = make(cfg)
      local pa, pb = a:named_parameters(), b:named_parameters()
      assert.are.equal(#pa, #pb)
      for i = 1, #pa do
        assert.are.equal(pa[i][1], pb[i][1])
        assert((pa[i][2] - pb[i][2]):abs():max():item() == 0, pa[i][1])
      end
    end
  end)

  it("blocks fuse the GELU and the residual add only into modules whose forward takes them", function()
    local nn = lt.nn
    local cfg = { n_layer = 1, n_head = 2, n_embd = 8, block_size = 8, vocab_size = 16 }
    local m = lt.models.gpt2(cfg, { generator = lt.Generator(4) })
    local idx = lt.tensor({ { 1, 2, 3 } }, "i64")
    local ref = m(idx)
    -- a Linear subclass (LoRA-style) whose forward takes x alone: the block applies the GELU itself
    local Plain = nn.Linear:extend("PlainLinear")
    function Plain:forward(x) return lt.F.linear(x, self.weight, self.bias) end
    local mlp = m.transformer.h[1].mlp
    local h8 = lt.randn({ 3, 8 })
    assert.are.equal("MlpBackward", mlp(h8).grad_fn) -- two plain Linears: one op (F.mlp)
    local swapped = Plain(8, 32)
    swapped.weight, swapped.bias = mlp.c_fc.weight, mlp.c_fc.bias
    mlp.c_fc = swapped
    assert.is_false(nn.fuses(swapped, "fuses_activation"))
    -- a LayerNorm subclass that overrides forward: the block adds the residual itself
    local Norm = nn.LayerNorm:extend("PlainNorm")
    function Norm:forward(x) return lt.F.layer_norm(x, self.weight, self.bias, self.eps) end
    local blk = m.transformer.h[1]
    local n2 = Norm(8)
    n2.weight, n2.bias = blk.ln_2.weight, blk.ln_2.bias
    blk.ln_2 = n2
    assert.is_false(nn.fuses(n2, "fuses_residual"))
    assert.is_true((m(idx) - ref):abs():max():item() < 1e-6)
    -- ln_1 and ln_f too (they add the MLP's output, carried from the block before, when they can)
    local m3 = lt.models.gpt2(cfg, { generator = lt.Generator(5), n_layer = 2 })
    local ref3 = m3(idx)
    for _, holder in ipairs { { m3.transformer.h[2], "ln_1" }, { m3.transformer, "ln_f" } } do
      local old = holder[1][holder[2]]
      local plain = Norm(8)
      plain.weight, plain.bias = old.weight, old.bias
      holder[1][holder[2]] = plain
    end
    assert.is_true((m3(idx) - ref3):abs():max():item() < 1e-6)
    local h, mo = blk(lt.randn({ 1, 3, 8 }), nil, lt.randn({ 1, 3, 8 }), true) -- carry: the stream and the MLP's output
    assert.are.same({ 1, 3, 8 }, h:shape())
    assert.are.same({ 1, 3, 8 }, mo:shape())
    assert.are.equal("LinearBackward", mlp(h8).grad_fn)
    -- a subclass that takes the GELU (fuses_activation) but changes the layer: its forward runs, not F.mlp
    local Scaled = nn.Linear:extend("ScaledLinear")
    function Scaled:forward(x, activation) return nn.Linear.forward(self, x, activation) * 2 end
    Scaled.fuses_activation = Scaled.forward
    local m2 = lt.models.gpt2(cfg, { generator = lt.Generator(4) })
    local mlp2 = m2.transformer.h[1].mlp
    local sc = Scaled(32, 8)
    sc.weight, sc.bias = mlp2.c_proj.weight, mlp2.c_proj.bias
    local before = mlp2(h8)
    mlp2.c_proj = sc
    local after = mlp2(h8)
    assert.is_true((after - before * 2):abs():max():item() < 1e-6, "the subclass's forward ran")
    assert.is_true(nn.fuses(nn.Linear(2, 2), "fuses_activation"))
  end)
  it("a block subclass with its own forward(x, kv) among plain blocks gets the whole stream", function()
    local idx = lt.tensor({ { 1, 2, 3, 4 } }, "i64")
    local makers = {
      { lt.models.gpt2, { n_layer = 3, n_head = 2, n_embd = 8, block_size = 8, vocab_size = 16 },
        function(m) return m.transformer.h end },
      { lt.models.llama, { n_layers = 3, n_heads = 2, n_kv_heads = 1, dim = 8, ffn_dim = 16, vocab_size = 16,
        max_seq_len = 8 }, function(m) return m.model.layers end },
    }
    for _, mk in ipairs(makers) do
      local m = mk[1](mk[2], { generator = lt.Generator(7), dtype = "f64" })
      local ref = m(idx)
      local blocks = mk[3](m)
      -- the middle block does what the class does, through the two-argument forward
      local cls = getmetatable(blocks[2]).class
      local Sub = cls:extend("TwoArgumentBlock")
      function Sub:forward(x, kv) return cls.forward(self, x, kv) end
      setmetatable(blocks[2], Sub._meta)
      assert.is_true((m(idx) - ref):abs():max():item() < 1e-12, "the block before handed its MLP output on")
      -- and as the last block, the final norm gets the whole stream
      setmetatable(blocks[2], cls._meta)
      setmetatable(blocks[3], Sub._meta)
      assert.is_true((m(idx) - ref):abs():max():item() < 1e-12, "the last block")
      -- an attention or MLP that returns nothing is an error, not a zero
      setmetatable(blocks[3], cls._meta)
      local attn = blocks[1].attn or blocks[1].self_attn
      local acls = getmetatable(attn).class
      local Silent = acls:extend("SilentAttention")
      function Silent:forward(x, kv) acls.forward(self, x, kv) end
      setmetatable(attn, Silent._meta)
      local ok, err = pcall(m, idx)
      assert.is_false(ok)
      assert.matches("the attention returned nothing", tostring(err), 1, true)
    end
  end)

  it("llama3-8b has Llama 3 8B's shapes", function()
    local c = require("lutra.models.llama").configs["llama3-8b"]
    assert.are.same({ 4096, 32, 32, 8, 128256, 14336 }, { c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.ffn_dim })
  end)
  it("tie_embeddings ties or unties the head of either model (one tensor counted once, or two)", function()
    local untied = lt.models.llama("llama-tiny")
    local tied = lt.models.llama("llama-tiny", { tie_embeddings = true })
    assert.are_not.equal(untied.model.embed_tokens.weight, untied.lm_head.weight)
    assert.are.equal(tied.model.embed_tokens.weight, tied.lm_head.weight)
    assert.are.equal(untied:num_parameters() - 512 * 64, tied:num_parameters())
    assert.is_nil(tied:state_dict()["lm_head.weight"])
    local g = lt.models.gpt2("gpt2-tiny", { tie_embeddings = false })
    assert.are_not.equal(g.transformer.wte.weight, g.lm_head.weight)
    assert.are.equal(lt.models.gpt2("gpt2-tiny"):num_parameters() + 512 * 64, g:num_parameters())
    assert.truthy(g:state_dict()["lm_head.weight"])
    H.assert_error(function() lt.models.llama("llama-tiny", { tie_embeddings = "yes" }) end, "tie_embeddings must be true or false")
    H.assert_error(function() lt.models.gpt2("gpt2-tiny", { tie_embeddings = 1 }) end, "tie_embeddings must be true or false")
  end)
  it("a config table takes overrides on top (both models)", function()
    local cfg = { n_layer = 1, n_head = 2, n_embd = 8, block_size = 8, vocab_size = 16 }
    local a = lt.models.gpt2(cfg, { generator = lt.Generator(3), n_layer = 2 })
    local b = lt.models.gpt2(cfg, { generator = lt.Generator(3), n_layer = 2 })
    assert.are.equal(2, a.transformer.h:len())
    assert.are.equal(0, (a.transformer.wte.weight - b.transformer.wte.weight):abs():max():item())
    assert.are.equal(1, cfg.n_layer) -- the caller's table is left alone
    local l = lt.models.llama({ dim = 8, n_layers = 1, n_heads = 2, n_kv_heads = 2, vocab_size = 16, ffn_dim = 16,
      max_seq_len = 8 }, { n_layers = 2 })
    assert.are.equal(2, l.model.layers:len())
  end)
  it("reports bad configs and inputs", function()
    H.assert_error(function() lt.models.gpt2("gpt3") end, "unknown config", "gpt2-tiny")
    H.assert_error(function() lt.models.gpt2("gpt2-tiny", { n_head = 5 }) end, "multiple of n_head")
    H.assert_error(function() lt.models.llama("llama-tiny", { n_kv_heads = 3 }) end, "do not fit")
    local m = lt.models.gpt2("gpt2-tiny")
    H.assert_error(function() m(lt.randint(0, 512, { 1, 65 })) end, "block size")
    H.assert_error(function() m(lt.tensor({ { 1, 600 } }, "i64")) end, "model.transformer.wte", "embedding", "index 600")
  end)
end)

describe("nn.Module", function()
  local nn = lt.nn
  it("registers parameters and children in order and names them", function()
    local Net = nn.Module:extend("Net")
    function Net:init()
      self.fc1 = nn.Linear(4, 8)
      self.act_scale = 2
      self.blocks = nn.ModuleList { nn.Linear(8, 8), nn.LayerNorm(8) }
      self.fc2 = nn.Linear(8, 2, { bias = false })
    end
    function Net:forward(x)
      x = self.fc1(x) * self.act_scale
      for _, b in ipairs(self.blocks:list()) do x = b(x) end
      return self.fc2(x)
    end
    local net = Net()
    local names = {}
    for _, np in ipairs(net:named_parameters()) do names[#names + 1] = np[1] end
    assert.are.same({ "fc1.weight", "fc1.bias", "blocks.0.weight", "blocks.0.bias", "blocks.1.weight",
      "blocks.1.bias", "fc2.weight" }, names)
    assert.are.equal(4 * 8 + 8 + 64 + 8 + 8 + 8 + 16, net:num_parameters())
    assert.are.equal(2, net.blocks:len())
    assert.are.equal("model.blocks.1", net.blocks[2]:path())
    assert.are.same({ 3, 2 }, net(lt.randn(3, 4)):shape())
    net:eval()
    assert.is_false(net.blocks[1].training)
    net:train()
    assert.is_true(net.blocks[1].training)
    local sd = net:state_dict()
    assert.are.same({ 8 }, sd["blocks.1.bias"]:shape())
    local err = H.assert_error(function() net(lt.randn(3, 5)) end, "model.fc1", "linear", "[3, 5]")
    assert.is_nil(err:find("model: model", 1, true)) -- the path is added once
  end)
  it("loads state dicts strictly, reporting every problem at once", function()
    local a, b = nn.Linear(3, 2), nn.Linear(3, 2)
    b:load_state_dict(a:state_dict())
    assert.are.same(a.weight:totable(), b.weight:totable())
    local bad = { weight = lt.zeros(2, 4), extra = lt.zeros(1) }
    H.assert_error(function() b:load_state_dict(bad) end, "missing: bias", "unexpected: extra",
      "wrong shape or dtype: weight (checkpoint [2, 4], model [2, 3])")
    b:load_state_dict({ weight = lt.zeros(2, 3) }, { strict = false })
    assert.are.equal(0, b.weight:abs():sum():item())
  end)
  it("moves to a dtype keeping tied weights tied", function()
    local m = lt.models.gpt2("gpt2-tiny")
    m:to("bf16")
    assert.are.equal("bf16", m.transformer.wte.weight.dtype)
    assert.are.equal(m.transformer.wte.weight, m.lm_head.weight)
    assert.is_true(m.transformer.wte.weight.requires_grad)
    local loss = m:loss(lt.randint(0, 512, { 1, 8 }), lt.randint(0, 512, { 1, 8 }))
    assert.are.equal("f32", loss.dtype) -- the loss stays in f32
    loss:backward()
    assert.are.equal("bf16", m.transformer.wte.weight.grad.dtype)
  end)
end)
