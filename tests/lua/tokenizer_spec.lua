-- tests/lua/tokenizer_spec.lua: GPT-2's BPE against tiktoken's ids for hard
-- strings (tests/ref/tokenizer_golden.json, from tests/ref/gen_tokenizer.py:
-- emoji, CJK, combining marks, \r\n, tabs, space runs, digits, contractions,
-- invalid UTF-8), the special token, decoding, streaming, the encoder.json +
-- vocab.bpe format, and malformed vocabularies. Needs data/gpt2.tiktoken
-- (make fetches it: tools/fetch-vocab).
local lt = require "lutra"
local H = require "tests.lua.helpers"

local tok = lt.tokenizer.load("data/gpt2.tiktoken")
local golden = H.load_json("tests/ref/tokenizer_golden.json")

local function tmpfile(text)
  local p = os.tmpname()
  local f = assert(io.open(p, "wb"))
  f:write(text)
  f:close()
  return p
end

describe("GPT-2 tokenizer against tiktoken " .. golden.tiktoken, function()
  for i, c in ipairs(golden.cases) do
    local text = H.b64decode(c.bytes)
    it(("case %d: %s"):format(i, (("%q"):format(text:sub(1, 40)):gsub("[%c]", "?"))), function()
      assert.are.same(c.ids, tok:encode(text))
      assert.are.same(c.special_ids, tok:encode(text, { allowed_special = "all" }))
      if not c.invalid then
        assert.are.equal(text, tok:decode(c.ids))
      else
        H.assert_error(function() tok:encode(text, { on_invalid_utf8 = "error" }) end, "invalid UTF-8", "byte")
        -- the ids are those of Python's bytes.decode(errors="replace"): the same replacement
        assert.are.equal(tok:decode(c.ids), lt.tokenizer.replace_invalid_utf8(text))
      end
    end)
  end
end)

describe("tokenizer", function()
  it("knows GPT-2's vocabulary size and <|endoftext|>", function()
    assert.are.equal(50257, tok.n_vocab)
    assert.are.equal(50256, tok.eot)
    assert.are.same({ 50256 }, tok:encode("<|endoftext|>", { allowed_special = { "<|endoftext|>" } }))
    assert.are_not.same({ 50256 }, tok:encode("<|endoftext|>"))
    assert.are.equal("<|endoftext|>", tok:decode { 50256 })
  end)
  it("encodes to tensors and in parallel", function()
    local t = tok:encode_tensor("Hello world")
    assert.are.equal("i32", t.dtype)
    assert.are.same({ 15496, 995 }, t:totable())
    local all, ends = tok:encode_many { "Hello world", "", "again" }
    assert.are.same({ 15496, 995, 50256, 50256, 17776, 50256 }, all:totable())
    assert.are.same({ 3, 4, 6 }, ends)
    assert.are.equal("Hello world", tok:decode(t))
  end)
  it("streams decoded text without splitting characters", function()
    local ids = tok:encode("né 😀 漢")
    local d = tok:decoder()
    local pieces = {}
    for _, id in ipairs(ids) do
      local s = d:push(id)
      pieces[#pieces + 1] = s
      -- every piece handed out is whole UTF-8
      assert.is_nil(s:find("[\xC0-\xFF]$"), "an incomplete character escaped: " .. s)
    end
    pieces[#pieces + 1] = d:flush()
    assert.are.equal("né 😀 漢", table.concat(pieces))
  end)
  it("replaces ill-formed UTF-8 as Python's decode(errors=\"replace\") does, on request", function()
    -- (expected values from CPython 3.11's bytes.decode("utf-8", errors="replace"))
    local R = "\239\191\189"
    local cases = {
      { "abc", "abc" }, { "\xe1\xbd", R }, { "a\xe1\xbdb", "a" .. R .. "b" }, { "\xc0\xaf", R .. R },
      { "\xed\xa0\x80", R .. R .. R }, { "\xf4\x90\x80\x80", R .. R .. R .. R },
      { "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80" }, { "\xf0\x9f\x98", R }, { "\xff", R },
      { "\xe2\x82\xac\x80", "\xe2\x82\xac" .. R }, { "\xe0\x80\x80", R .. R .. R },
      { "\xf0\x80\x80\x80", R .. R .. R .. R }, { "\xc3", R }, { "\xc3\xa9", "\xc3\xa9" },
      { "\xe1\x80\xe1\x80\x80", R .. "\xe1\x80\x80" }, { "", "" },
    }
    for _, c in ipairs(cases) do
      assert.are.equal(c[2], lt.tokenizer.replace_invalid_utf8(c[1]), ("%q"):format(c[1]))
    end
    -- a model's ids need not end on a whole character: bytes by default, valid text on request
    local ids = tok:encode("😀")
    assert.is_true(#ids > 1)
    local cut = { ids[1] }
    assert.are_not.equal(tok:decode(cut), tok:decode(cut, { errors = "replace" }))
    assert.are.equal(R, tok:decode(cut, { errors = "replace" }):sub(-3))
    local d = tok:decoder { errors = "replace" }
    assert.are.equal("", d:push(ids[1]))
    assert.are.equal(R, d:flush())
    -- bytes that can never start a character come out at once, not a push later
    local byte_id = {}
    for id = 0, 50256 do
      local b = tok:decode { id }
      if #b == 1 then byte_id[b:byte()] = id end
    end
    d = tok:decoder { errors = "replace" }
    assert.are.equal(R, d:push(byte_id[0xFF]))
    assert.are.equal(R, d:push(byte_id[0xC1]))
    assert.are.equal("", d:push(byte_id[0xE0])) -- (E0 A0..BF would continue it)
    assert.are.equal(R .. R, d:push(byte_id[0x80]))
    assert.are.equal("", d:push(byte_id[0xF0]))
    assert.are.equal("", d:push(byte_id[0x9F]))
    assert.are.equal(R, d:flush()) -- (F0 9F: one cut character)
    H.assert_error(function() tok:decode(cut, { errors = "ignore" }) end, "decode", "replace")
  end)
  it("rejects ids outside the vocabulary", function()
    H.assert_error(function() tok:decode { 1, 50257 } end, "decode", "50257", "position 2")
    H.assert_error(function() tok:decode { -1 } end, "decode", "-1")
    H.assert_error(function() tok:decode { 1.5 } end, "whole number")
  end)
  it("reads GPT-2's encoder.json and vocab.bpe the same", function()
    -- build them from the tiktoken file: byte-level unicode strings
    local cp = {}
    local n = 0
    for b = 0, 255 do
      local printable = (b >= 33 and b <= 126) or (b >= 0xA1 and b <= 0xAC) or (b >= 0xAE and b <= 0xFF)
      if printable then cp[b] = b else cp[b] = 256 + n; n = n + 1 end
    end
    local function u8(c)
      if c < 0x80 then return string.char(c) end
      return string.char(0xC0 + math.floor(c / 64), 0x80 + c % 64)
    end
    local function bl(bytes)
      local o = {}
      for i = 1, #bytes do o[i] = u8(cp[bytes:byte(i)]) end
      return table.concat(o)
    end
    local enc = {}
    for line in io.lines("data/gpt2.tiktoken") do
      local b64, rank = line:match("^(%S+) (%d+)$")
      enc[bl(H.b64decode(b64))] = tonumber(rank)
    end
    enc["<|endoftext|>"] = 50256
    local ej = tmpfile(lt.json.encode(enc))
    local bpe = tmpfile("#version: 0.2\nĠ t\nĠ a\n")
    local tok2 = lt.tokenizer.load { encoder = ej, bpe = bpe }
    assert.are.equal(50257, tok2.n_vocab)
    for i = 1, 30 do
      local text = H.b64decode(golden.cases[i].bytes)
      assert.are.same(tok:encode(text), tok2:encode(text))
    end
    local badbpe = tmpfile("#version: 0.2\nĠ zzzzzqqq\n")
    H.assert_error(function() lt.tokenizer.load { encoder = ej, bpe = badbpe } end, "vocab.bpe line 2")
    os.remove(ej)
    os.remove(bpe)
    os.remove(badbpe)
  end)
  it("refuses a gpt2.tiktoken that is not GPT-2's (SHA-256, as tiktoken checks) unless told it is another vocabulary", function()
    -- cut at a line boundary, it parses, with fewer ids, and encodes differently
    local dir = os.tmpname()
    os.remove(dir)
    os.execute("mkdir -p " .. dir)
    local cut = dir .. "/gpt2.tiktoken"
    assert.is_true(os.execute(("head -n 50000 data/gpt2.tiktoken > %s"):format(cut)) == 0)
    H.assert_error(function() lt.tokenizer.load(cut) end, cut .. " is not GPT-2's vocabulary", "its SHA-256 is ",
      lt.tokenizer.GPT2_SHA256, "it holds 50001 ids", "{sha256 = false}")
    local other = lt.tokenizer.load(cut, { sha256 = false }) -- told: another vocabulary
    assert.are.equal(50001, other.n_vocab)
    local text = tok:decode { 50255 } -- a token past the cut
    assert.are.same({ 50255 }, tok:encode(text))
    assert.are_not.same({ 50255 }, other:encode(text))
    -- an expected value of its own: checked against coreutils' sha256sum
    local p = io.popen("sha256sum " .. cut)
    local sum = p:read("*a"):match("^(%x+)")
    p:close()
    assert.are.equal(50001, lt.tokenizer.load(cut, { sha256 = sum:upper() }).n_vocab)
    H.assert_error(function() lt.tokenizer.load(cut, { sha256 = lt.tokenizer.GPT2_SHA256 }) end, "its SHA-256 is " .. sum,
      "not the " .. lt.tokenizer.GPT2_SHA256 .. " asked for")
    H.assert_error(function() lt.tokenizer.load(cut, { sha256 = "abc" }) end, "sha256 must be 64 hex digits or false")
    -- the value tools/fetch-vocab checks what it fetches against
    local fv = assert(io.open("tools/fetch-vocab")):read("*a")
    assert.are.equal(lt.tokenizer.GPT2_SHA256, fv:match("\nsum=(%x+)\n"))
    -- the file itself, under its name and by default
    assert.are.equal(50257, lt.tokenizer.load().n_vocab)
    assert.are.equal(50257, lt.tokenizer.load("data/gpt2.tiktoken", { sha256 = lt.tokenizer.GPT2_SHA256 }).n_vocab)
    local ok = pcall(lt.tokenizer.load, "data/gpt2.tiktoken")
    assert.is_true(ok)
    -- the recipe that writes shards says so too, in its own setting's terms
    local jl = dir .. "/docs.jsonl"
    local f = assert(io.open(jl, "w"))
    f:write('{"text": "one"}\n{"text": "two"}\n')
    f:close()
    local q = io.popen(("./lutra recipes/prepare.lua --vocab=%s --input=%s --out=%s/out --quiet 2>&1; echo rc=$?")
      :format(cut, jl, dir))
    local out = q:read("*a")
    q:close()
    assert.truthy(out:find("is not GPT-2's vocabulary", 1, true) and out:find("--vocab_sha256=any", 1, true), out)
    assert.truthy(out:find("rc=1", 1, true), out)
    q = io.popen(("./lutra recipes/prepare.lua --vocab=%s --vocab_sha256=any --input=%s --out=%s/out --quiet 2>&1; echo rc=$?")
      :format(cut, jl, dir))
    out = q:read("*a")
    q:close()
    assert.truthy(out:find("rc=0", 1, true), out)
    os.execute("rm -rf " .. dir)
  end)
  it("rejects malformed vocabularies naming the file and the line", function()
    local p = tmpfile("IQ== 0\nIg== x\n")
    H.assert_error(function() lt.tokenizer.load(p) end, p, "line 2", "rank")
    local p2 = tmpfile("IQ== 0\n!!!! 1\n")
    H.assert_error(function() lt.tokenizer.load(p2) end, "line 2", "base64")
    local p3 = tmpfile("IQ== 0\nIQ== 1\n")
    H.assert_error(function() lt.tokenizer.load(p3) end, "line 2", "repeats")
    local p4 = tmpfile("IQ== 0\n")
    H.assert_error(function() lt.tokenizer.load(p4) end, "byte", "no token")
    local p5 = tmpfile("IQ== 5\n")
    H.assert_error(function() lt.tokenizer.load(p5) end, "rank 5")
    H.assert_error(function() lt.tokenizer.load("/nonexistent/vocab") end, "cannot open")
    local p6 = tmpfile("not json")
    H.assert_error(function() lt.tokenizer.load { encoder = p6 } end, "encoder.json", "JSON")
    -- ids far outside int64_t: range-checked before the conversion (UBSan: float-cast-overflow)
    local p7 = tmpfile('{"!": 1e30}')
    H.assert_error(function() lt.tokenizer.load { encoder = p7 } end, "encoder.json entry 1", "id 1e+30 is outside 0..0")
    local p8 = tmpfile('{"!": -1e30}')
    H.assert_error(function() lt.tokenizer.load { encoder = p8 } end, "encoder.json entry 1", "id -1e+30 is outside")
    for _, q in ipairs { p, p2, p3, p4, p5, p6, p7, p8 } do os.remove(q) end
  end)
end)
