-- tests/lua/hf_spec.lua: lt.hf against Hugging Face-layout files written by
-- PyTorch (tests/ref/gen_hf.py write tests/ref/hf): lutra loads GPT-2 (in
-- the original release's layout) and Llama and reproduces their logits;
-- exports reload to the same logits; where /usr/bin/python3 has torch,
-- gen_hf.py check reloads lutra's export (and, with transformers, through
-- from_pretrained) and reproduces lutra's logits; tie_word_embeddings is
-- honoured both ways (tied: one tensor, counted once, PyTorch's count and
-- gradient; untied: two); sharded weights (model.safetensors.index.json and
-- its shards, as save_pretrained writes them: tests/ref/shard_hf.py wrote
-- tests/ref/hf/llama_sharded) load, and exports past max_shard_bytes shard;
-- bad directories are rejected naming the file and field or tensor.
local lt = require "lutra"
local H = require "tests.lua.helpers"

local REF = H.load_json("tests/ref/hf/hf.json")
local TMP = os.tmpname() .. "-hf"

local function ids()
  return lt.tensor(REF.ids, { dtype = "i64" })
end

local function max_diff(logits, ref)
  local want = lt.tensor(ref.logits, { dtype = "f64" }):reshape(ref.shape)
  return (logits:to("f64") - want):abs():max():item()
end

local sh = H.sh

local function copy_dir(from, to)
  os.execute(("rm -rf %s && mkdir -p %s && cp %s/* %s/"):format(to, to, from, to))
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function has_torch()
  local _, rc = sh("/usr/bin/python3 -c 'import torch' >/dev/null")
  return rc == 0
end

describe("lt.hf", function()
  for _, kind in ipairs { "gpt2", "llama" } do
    it("loads " .. kind .. " from Hugging Face files and reproduces PyTorch's logits", function()
      local model = lt.hf.load("tests/ref/hf/" .. kind)
      local d = max_diff(lt.no_grad(function() return model(ids()) end), REF[kind])
      assert(d < 1e-4, ("max abs difference %g"):format(d))
    end)

    it("exports " .. kind .. " so that it loads back to the same logits", function()
      local model = lt.hf.load("tests/ref/hf/" .. kind)
      local dir = TMP .. "/" .. kind
      lt.hf.export(model, dir)
      local back = lt.hf.load(dir)
      local a = lt.no_grad(function() return model(ids()) end)
      local b = lt.no_grad(function() return back(ids()) end)
      assert.are.equal(0, (a - b):abs():max():item())
      local cfg = H.load_json(dir .. "/config.json")
      assert.are.equal(kind == "gpt2" and "GPT2LMHeadModel" or "LlamaForCausalLM", cfg.architectures[1])
    end)
  end

  it("loads a tied Llama (no lm_head.weight) as one tensor: PyTorch's logits, count and gradient, tied after a step", function()
    local ref = REF.llama_tied
    local model = lt.hf.load("tests/ref/hf/llama_tied")
    assert.is_true(model.config.tie_embeddings)
    assert.are.equal(model.model.embed_tokens.weight, model.lm_head.weight) -- one tensor, not a copy
    assert.are.equal(ref.num_parameters, model:num_parameters()) -- 21664: the embedding once, as PyTorch counts
    local d = max_diff(lt.no_grad(function() return model(ids()) end), ref)
    assert(d < 1e-4, ("max abs difference %g"):format(d))
    -- the shared weight's gradient sums its two uses (embedding and head), as in PyTorch
    local x = ids()
    local T = x:size(2)
    local loss = model:loss(x:narrow(2, 1, T - 1), x:narrow(2, 2, T - 1))
    loss:backward()
    local want = lt.tensor(ref.embed_grad, { dtype = "f64" }):reshape(model.lm_head.weight:shape())
    local gd = (model.model.embed_tokens.weight.grad:to("f64") - want):abs():max():item()
    assert(gd < 1e-5, ("embedding gradient: max abs difference %g"):format(gd))
    local before = model.lm_head.weight:clone()
    lt.optim.AdamW(model, { lr = 1e-2 }):step()
    assert.are.equal(model.model.embed_tokens.weight, model.lm_head.weight)
    assert.is_true((model.lm_head.weight - before):abs():max():item() > 0)
    -- exported as transformers saves a tied model: the flag, no lm_head.weight; it loads back tied
    local dir = TMP .. "/tied-export"
    lt.hf.export(model, dir)
    assert.is_true(H.load_json(dir .. "/config.json").tie_word_embeddings)
    assert.is_nil(lt.load(dir .. "/model.safetensors")["lm_head.weight"])
    local back = lt.hf.load(dir)
    assert.are.equal(back.model.embed_tokens.weight, back.lm_head.weight)
    assert.are.equal(0, (back.lm_head.weight - model.lm_head.weight):abs():max():item())
  end)

  it("takes a tied file that stores both names with equal data, refuses unequal ones and an untied file without a head", function()
    local dir = TMP .. "/tied-both"
    copy_dir("tests/ref/hf/llama_tied", dir)
    local t = lt.load(dir .. "/model.safetensors")
    t["lm_head.weight"] = t["model.embed_tokens.weight"]:clone()
    lt.save(dir .. "/model.safetensors", t)
    local model = lt.hf.load(dir)
    assert.are.equal(model.model.embed_tokens.weight, model.lm_head.weight)
    assert.are.equal(REF.llama_tied.num_parameters, model:num_parameters())
    t["lm_head.weight"] = t["lm_head.weight"] + 1
    lt.save(dir .. "/model.safetensors", t)
    H.assert_error(function() lt.hf.load(dir) end, dir .. "/model.safetensors: lm_head.weight differs from model.embed_tokens.weight",
      "tie_word_embeddings")
    -- untied: two tensors, counted twice; an untied file must hold the head
    local untied = lt.hf.load("tests/ref/hf/llama")
    assert.is_false(untied.config.tie_embeddings)
    assert.are_not.equal(untied.model.embed_tokens.weight, untied.lm_head.weight)
    assert.are.equal(REF.llama_tied.num_parameters + 96 * 32, untied:num_parameters())
    t["lm_head.weight"] = nil
    lt.save(dir .. "/model.safetensors", t)
    local cfg = H.load_json(dir .. "/config.json")
    cfg.tie_word_embeddings = false
    write(dir .. "/config.json", lt.json.encode(cfg))
    H.assert_error(function() lt.hf.load(dir) end, "tie_word_embeddings is false", "holds no lm_head.weight")
  end)

  it("loads and exports an untied GPT-2 (tie_word_embeddings false) with its own head", function()
    local model = lt.models.gpt2 { n_layer = 1, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 50,
      pad_vocab = 64, tie_embeddings = false, generator = lt.Generator(4) }
    assert.are_not.equal(model.transformer.wte.weight, model.lm_head.weight)
    local dir = TMP .. "/gpt2-untied"
    lt.hf.export(model, dir)
    assert.is_false(H.load_json(dir .. "/config.json").tie_word_embeddings)
    assert.are.same({ 50, 16 }, lt.load(dir .. "/model.safetensors")["lm_head.weight"]:shape())
    local back = lt.hf.load(dir, { pad_vocab = 64 })
    assert.is_false(back.config.tie_embeddings)
    assert.are_not.equal(back.transformer.wte.weight, back.lm_head.weight)
    assert.are.equal(model:num_parameters(), back:num_parameters())
    local x = lt.tensor({ { 1, 2, 3, 49 } }, { dtype = "i64" })
    local a = lt.no_grad(function() return model(x) end)
    local b = lt.no_grad(function() return back(x) end)
    assert.are.equal(0, (a - b):abs():max():item())
  end)

  it("stores GPT-2 as GPT2LMHeadModel does: Conv1D weights (in, out), the tied head once, the vocabulary unpadded", function()
    local model = lt.models.gpt2 { n_layer = 1, n_head = 2, n_embd = 16, block_size = 8, vocab_size = 50,
      pad_vocab = 64, generator = lt.Generator(3) }
    local dir = TMP .. "/padded"
    lt.hf.export(model, dir)
    local t = lt.load(dir .. "/model.safetensors")
    assert.is_nil(t["lm_head.weight"])
    assert.are.same({ 50, 16 }, t["transformer.wte.weight"]:shape())
    assert.are.same({ 16, 48 }, t["transformer.h.0.attn.c_attn.weight"]:shape())
    assert.are.same({ 64, 16 }, t["transformer.h.0.mlp.c_proj.weight"]:shape())
    local back = lt.hf.load(dir, { pad_vocab = 64 })
    local x = lt.tensor({ { 1, 2, 3, 49 } }, { dtype = "i64" })
    local a = lt.no_grad(function() return model(x) end)
    local b = lt.no_grad(function() return back(x) end)
    assert.are.equal(0, (a - b):abs():max():item())
  end)

  it("is read back by PyTorch (and transformers where installed) to lutra's logits", function()
    if not has_torch() then
      pending("skipped: /usr/bin/python3 has no torch")
      return
    end
    for _, case in ipairs {
      { "gpt2", lt.models.gpt2 { n_layer = 2, n_head = 4, n_embd = 32, block_size = 16, vocab_size = 96,
        pad_vocab = 64, generator = lt.Generator(8) } },
      { "llama", lt.models.llama("llama-tiny", { vocab_size = 96, generator = lt.Generator(9) }) },
      { "llama-tied", lt.models.llama("llama-tiny", { vocab_size = 96, tie_embeddings = true,
        generator = lt.Generator(10) }) },
      { "gpt2-untied", lt.models.gpt2 { n_layer = 1, n_head = 4, n_embd = 32, block_size = 16, vocab_size = 96,
        tie_embeddings = false, generator = lt.Generator(11) } },
      { "llama-sharded", lt.models.llama("llama-tiny", { vocab_size = 96, generator = lt.Generator(12) }),
        { max_shard_bytes = 40000 } },
      { "llama3-rope", lt.models.llama("llama-tiny", { vocab_size = 96, generator = lt.Generator(13),
        rope_scaling = { rope_type = "llama3", factor = 8, low_freq_factor = 1, high_freq_factor = 4,
          original_max_position_embeddings = 4 } }) },
      { "llama-rope-linear", lt.models.llama("llama-tiny", { vocab_size = 96, generator = lt.Generator(14),
        rope_scaling = { type = "linear", factor = 2 } }) },
      { "llama-head-dim", lt.models.llama("llama-tiny", { vocab_size = 96, generator = lt.Generator(15), head_dim = 24 }) },
    } do
      local name, model = case[1], case[2]
      local dir = TMP .. "/torch-" .. name
      lt.hf.export(model, dir, case[3])
      local logits = lt.no_grad(function() return model(ids()) end)
      write(dir .. "-logits.json", lt.json.encode { ids = REF.ids, shape = logits:shape(),
        logits = logits:reshape(-1):to("f64"):totable() })
      local out, rc = sh(("/usr/bin/python3 tests/ref/gen_hf.py check %s %s-logits.json"):format(dir, dir))
      assert.are.equal(0, rc, out)
      assert.truthy(out:find("torch forward vs lutra logits", 1, true), out)
      assert.truthy(out:find("from_pretrained", 1, true), out)
    end
  end)

  it("loads sharded weights (an index and its shards, as save_pretrained writes them) to PyTorch's logits", function()
    local model = lt.hf.load("tests/ref/hf/llama_sharded")
    local d = max_diff(lt.no_grad(function() return model(ids()) end), REF.llama)
    assert(d < 1e-4, ("max abs difference %g"):format(d))
  end)

  it("exports in shards past max_shard_bytes, with the index, and back to one file; a directory keeps one layout", function()
    local model = lt.hf.load("tests/ref/hf/llama")
    local dir = TMP .. "/sharded"
    os.execute("rm -rf " .. dir)
    lt.hf.export(model, dir, { max_shard_bytes = 30000 })
    local index = H.load_json(dir .. "/model.safetensors.index.json")
    local files, total = {}, 0
    for name, file in pairs(index.weight_map) do
      files[file] = true
      total = total + lt.safetensors.open(dir .. "/" .. file):get(name):nbytes()
    end
    local n = 0
    for f in pairs(files) do
      n = n + 1
      assert.truthy(f:match("^model%-%d%d%d%d%d%-of%-%d%d%d%d%d%.safetensors$"), f)
    end
    assert(n >= 3, n .. " shards")
    assert.are.equal(total, index.metadata.total_size)
    assert.is_nil(io.open(dir .. "/model.safetensors"))
    local a = lt.no_grad(function() return model(ids()) end)
    local b = lt.no_grad(function() return lt.hf.load(dir)(ids()) end)
    assert.are.equal(0, (a - b):abs():max():item())
    lt.hf.export(model, dir) -- one file now: the index and the shards go
    assert.is_nil(io.open(dir .. "/model.safetensors.index.json"))
    for f in pairs(files) do assert.is_nil(io.open(dir .. "/" .. f), f) end
    b = lt.no_grad(function() return lt.hf.load(dir)(ids()) end)
    assert.are.equal(0, (a - b):abs():max():item())
    H.assert_error(function() lt.hf.export(model, dir, { max_shard_bytes = 0 }) end, "max_shard_bytes must be a number > 0")
  end)

  it("names the shard an index names that is missing, and a tensor mapped to a shard that lacks it", function()
    local dir = TMP .. "/bad-index"
    copy_dir("tests/ref/hf/llama_sharded", dir)
    local index = dir .. "/model.safetensors.index.json"
    local text = assert(io.open(index)):read("*a")
    os.remove(dir .. "/model-00002-of-00003.safetensors")
    H.assert_error(function() lt.hf.load(dir) end, "names the shard " .. dir .. "/model-00002-of-00003.safetensors",
      "which is missing")
    copy_dir("tests/ref/hf/llama_sharded", dir)
    write(index, (text:gsub('"model.norm.weight": "model%-0000%d%-of%-00003.safetensors"',
      '"model.norm.weight": "model-00001-of-00003.safetensors"')))
    H.assert_error(function() lt.hf.load(dir) end, "maps model.norm.weight to " .. dir ..
      "/model-00001-of-00003.safetensors, which does not hold it")
    write(index, (text:gsub('"model.norm.weight": "model%-0000%d%-of%-00003.safetensors"',
      '"model.norm.weight": "../llama/model.safetensors"')))
    H.assert_error(function() lt.hf.load(dir) end, "a path outside the directory")
    write(index, '{"weight_map": 3}')
    H.assert_error(function() lt.hf.load(dir) end, "is not a safetensors index")
    os.execute("rm -rf " .. dir .. "/*.safetensors*")
    H.assert_error(function() lt.hf.load(dir) end, "holds neither model.safetensors nor model.safetensors.index.json")
  end)

  it("takes Llama 3.1's rope_scaling (llama3, and linear) both ways, and names a type it does not take", function()
    local dir = TMP .. "/rope"
    copy_dir("tests/ref/hf/llama", dir)
    local cfg = H.load_json(dir .. "/config.json")
    cfg.rope_scaling = { rope_type = "llama3", factor = 8, low_freq_factor = 1, high_freq_factor = 4,
      original_max_position_embeddings = 4 }
    write(dir .. "/config.json", lt.json.encode(cfg))
    local model = lt.hf.load(dir)
    assert.are.equal("llama3", model.config.rope_scaling.rope_type)
    local plain = lt.hf.load("tests/ref/hf/llama")
    local a = lt.no_grad(function() return model(ids()) end)
    assert((a - lt.no_grad(function() return plain(ids()) end)):abs():max():item() > 1e-4) -- (positions past 4/4)
    lt.hf.export(model, dir .. "-out")
    assert.are.equal(8, H.load_json(dir .. "-out/config.json").rope_scaling.factor)
    assert.are.equal(0, (lt.no_grad(function() return lt.hf.load(dir .. "-out")(ids()) end) - a):abs():max():item())
    for _, bad in ipairs { { { rope_type = "yarn", factor = 4 }, "rope_scaling: scaling type yarn is not supported" },
      { { rope_type = "dynamic", factor = 2 }, "scaling type dynamic is not supported" },
      { { rope_type = "llama3", factor = 8 }, "llama3 scaling needs low_freq_factor > 0, got nil" } } do
      cfg.rope_scaling = bad[1]
      write(dir .. "/config.json", lt.json.encode(cfg))
      H.assert_error(function() lt.hf.load(dir) end, dir .. "/config.json", bad[2])
    end
    local x = lt.randn({ 1, 2, 4, 8 })
    H.assert_error(function() lt.F.rope(x, { scaling = { rope_type = "linear", factor = 0 } }) end,
      "linear scaling needs factor > 0, got 0")
    H.assert_error(function() lt.F.rope(x, { scaling = { rope_type = "llama3", factor = 2, low_freq_factor = 4,
      high_freq_factor = 1, original_max_position_embeddings = 8 } }) end, "low_freq_factor < high_freq_factor")
    H.assert_error(function() lt.models.llama("llama-tiny", { rope_scaling = "llama3" }) end,
      "llama: config rope_scaling: scaling must be a table")
  end)

  it("takes a head_dim that is not hidden_size / heads (Mistral-Nemo's, Qwen3's) both ways", function()
    local model = lt.models.llama("llama-tiny", { vocab_size = 96, generator = lt.Generator(15), head_dim = 24 })
    assert.are.equal("96x64", table.concat(model.model.layers[1].self_attn.q_proj.weight:shape(), "x"))
    local dir = TMP .. "/head-dim"
    lt.hf.export(model, dir)
    assert.are.equal(24, H.load_json(dir .. "/config.json").head_dim)
    local back = lt.hf.load(dir)
    assert.are.equal(24, back.config.head_dim)
    local a = lt.no_grad(function() return model(ids()) end)
    assert.are.equal(0, (lt.no_grad(function() return back(ids()) end) - a):abs():max():item())
    H.assert_error(function() lt.models.llama("llama-tiny", { head_dim = 15 }) end, "head_dim 15", "even head size")
  end)

  it("names the file and field of a bad config.json", function()
    local dir = TMP .. "/badcfg"
    copy_dir("tests/ref/hf/gpt2", dir)
    local cfg = H.load_json(dir .. "/config.json")
    cfg.n_embd = nil
    write(dir .. "/config.json", lt.json.encode(cfg))
    local ok, err = pcall(lt.hf.load, dir)
    assert.is_false(ok)
    assert.truthy(tostring(err):find(dir .. "/config.json: the field 'n_embd' is missing", 1, true), err)
    cfg.n_embd, cfg.architectures, cfg.model_type = 32, { "BertModel" }, "bert"
    write(dir .. "/config.json", lt.json.encode(cfg))
    ok, err = pcall(lt.hf.load, dir)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("architectures BertModel", 1, true), err)
    write(dir .. "/config.json", "{not json")
    ok, err = pcall(lt.hf.load, dir)
    assert.truthy(tostring(err):find("config.json is not a JSON object", 1, true), err)
    os.remove(dir .. "/config.json")
    ok, err = pcall(lt.hf.load, dir)
    assert.truthy(tostring(err):find(dir .. "/config.json is missing", 1, true), err)
  end)

  it("checks config values and the file's layers before building a model", function()
    local dir = TMP .. "/badvals"
    local function with(edit, ...)
      copy_dir("tests/ref/hf/gpt2", dir)
      local cfg = H.load_json(dir .. "/config.json")
      edit(cfg)
      write(dir .. "/config.json", lt.json.encode(cfg))
      H.assert_error(function() lt.hf.load(dir) end, ...)
    end
    with(function(c) c.n_layer = 100000 end, "config.json: n_layer is 100000 but", "holds 2 layers")
    with(function(c) c.n_positions = 0 end, "config.json: the field 'n_positions' must be a whole number")
    with(function(c) c.n_embd = "32" end, "the field 'n_embd' must be a number")
    with(function(c) c.n_head = 5 end, "n_embd 32 is not a multiple of n_head 5")
    with(function(c) c.tie_word_embeddings = "false" end, "'tie_word_embeddings' must be true or false")
    with(function(c) c.architectures = { "MistralForCausalLM" } end, "architectures MistralForCausalLM")
    H.assert_error(function() lt.hf.load("tests/ref/hf/gpt2", { dtype = "f8" }) end, "dtype must be")
  end)

  it("refuses a GPT-2 file with both name forms or a head unlike wte where config.json ties them", function()
    local dir = TMP .. "/twice"
    copy_dir("tests/ref/hf/gpt2", dir)
    local t = lt.load(dir .. "/model.safetensors")
    t["transformer.wte.weight"] = t["wte.weight"]
    lt.save(dir .. "/model.safetensors", t)
    H.assert_error(function() lt.hf.load(dir) end, "holds both wte.weight and transformer.wte.weight")
    t["transformer.wte.weight"] = nil
    t["lm_head.weight"] = lt.zeros({ 96, 16 })
    lt.save(dir .. "/model.safetensors", t)
    H.assert_error(function() lt.hf.load(dir) end, "lm_head.weight differs from transformer.wte.weight")
  end)

  it("names the tensor that is missing, unexpected or mis-shaped", function()
    local dir = TMP .. "/badw"
    copy_dir("tests/ref/hf/llama", dir)
    local t = lt.load(dir .. "/model.safetensors")
    t["model.norm.weight"] = nil
    t["model.layers.0.mlp.up_proj.weight"] = lt.zeros({ 3, 3 })
    t["model.extra.weight"] = lt.zeros({ 2 })
    t["model.layers.1.self_attn.q_proj.weight"] = lt.zeros({ 32, 32 }, { dtype = "i32" })
    lt.save(dir .. "/model.safetensors", t)
    local ok, err = pcall(lt.hf.load, dir)
    assert.is_false(ok)
    err = tostring(err)
    assert.truthy(err:find(dir .. "/model.safetensors", 1, true), err)
    assert.truthy(err:find("missing: model.norm.weight", 1, true), err)
    assert.truthy(err:find("unexpected: model.extra.weight", 1, true), err)
    assert.truthy(err:find("wrong shape or dtype: model.layers.0.mlp.up_proj.weight", 1, true), err)
    assert.truthy(err:find("model.layers.1.self_attn.q_proj.weight (checkpoint dtype i32, model f32)", 1, true), err)
    os.remove(dir .. "/model.safetensors")
    ok, err = pcall(lt.hf.load, dir)
    assert.is_false(ok)
    assert.truthy(tostring(err):find("model.safetensors", 1, true), err)
  end)
end)
