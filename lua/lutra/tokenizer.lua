--- lutra.tokenizer (lt.tokenizer): GPT-2's byte-level BPE (host/io/tokenizer.c),
-- giving the ids tiktoken gives.
--
--   local tok = lt.tokenizer.load("data/gpt2.tiktoken")     -- or load{encoder=, bpe=}
--   local ids = tok:encode("Hello world")                   -- {15496, 995}
--   local t = tok:encode_tensor(text)                       -- i32 tensor
--   print(tok:decode(ids))                                  -- bytes; {errors = "replace"}: valid UTF-8
--   local dec = tok:decoder()   dec:push(id) -> text ready so far (whole characters)
local capi = require "lutra.capi"
local tensor = require "lutra.tensor"
local ffi, C, fail = capi.ffi, capi.C, capi.fail

local M = {}
local Tokenizer = {}
Tokenizer.__index = Tokenizer

local tok_box = ffi.new("lt_tokenizer*[1]")
local ids_box = ffi.new("int32_t*[1]")
local n_box = ffi.new("int64_t[1]")
local bytes_box = ffi.new("char*[1]")
local len_box = ffi.new("size_t[1]")

M.DEFAULT = "data/gpt2.tiktoken"
--- The SHA-256 of GPT-2's gpt2.tiktoken: the value tiktoken pins for its
-- r50k_base (gpt2) encoding, and tools/fetch-vocab checks.
M.GPT2_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"

local hex_box = ffi.new("char[65]")

--- lt.tokenizer.load(path[, {sha256 =}]) for a tiktoken file, or
-- load{encoder = "encoder.json", bpe = "vocab.bpe"} for GPT-2's original
-- files. A file named gpt2.tiktoken (the default, data/gpt2.tiktoken) is
-- GPT-2's: its SHA-256 must be M.GPT2_SHA256, as tiktoken checks, so a copy
-- cut short or damaged is refused instead of giving other ids. opts.sha256
-- (64 hex digits) asks another file for its own value; false checks nothing
-- (a different vocabulary under that name). Raises naming the file and the
-- problem (missing file, bad line, missing rank, another SHA-256 ...).
function M.load(src, opts)
  src = src or M.DEFAULT
  local want = opts and opts.sha256
  if opts ~= nil and type(opts) ~= "table" then error("tokenizer.load: opts must be a table ({sha256 =})", 2) end
  if want ~= nil and want ~= false and not (type(want) == "string" and want:match("^%x+$") and #want == 64) then
    error(("tokenizer.load: sha256 must be 64 hex digits or false, got %s"):format(tostring(want)), 2)
  end
  if type(src) == "table" and want then error("tokenizer.load: sha256 is checked for a tiktoken file (a path)", 2) end
  local st
  if type(src) == "table" then
    if type(src.encoder) ~= "string" then error("tokenizer.load: {encoder = path[, bpe = path]}", 2) end
    st = C.lt_tokenizer_load_gpt2(src.encoder, src.bpe, tok_box)
  elseif type(src) == "string" then
    st = C.lt_tokenizer_load_tiktoken(src, tok_box)
  else
    error("tokenizer.load: expected a path or {encoder =, bpe =}", 2)
  end
  if st ~= 0 then fail(2) end
  local t = ffi.gc(tok_box[0], C.lt_tokenizer_free)
  local tok = setmetatable({ t = t, n_vocab = tonumber(C.lt_tokenizer_vocab_size(t)),
    eot = tonumber(C.lt_tokenizer_eot(t)) }, Tokenizer)
  local gpt2 = want == nil and type(src) == "string" and src:match("[^/]*$") == "gpt2.tiktoken"
  if gpt2 then want = M.GPT2_SHA256 end
  if want then
    if C.lt_tokenizer_file_sha256(src, hex_box) ~= 0 then fail(2) end
    local got = ffi.string(hex_box)
    if got ~= want:lower() then
      if gpt2 then
        error(("tokenizer.load: %s is not GPT-2's vocabulary: its SHA-256 is %s, GPT-2's (tiktoken's r50k_base) %s; it holds %d ids, GPT-2's 50257 (a copy cut short or damaged gives other ids): fetch it again (delete it; make data/gpt2.tiktoken runs tools/fetch-vocab), or load it with {sha256 = false} if it is another vocabulary")
          :format(src, got, M.GPT2_SHA256, tok.n_vocab), 2)
      end
      error(("tokenizer.load: %s: its SHA-256 is %s, not the %s asked for (%d ids)"):format(src, got, want:lower(),
        tok.n_vocab), 2)
    end
  end
  return tok
end

local function allows(opts)
  local a = opts and opts.allowed_special
  if a == nil then return 0 end
  if a == "all" then return 1 end
  if type(a) == "table" then
    for k, v in pairs(a) do
      if v == "<|endoftext|>" or k == "<|endoftext|>" then return 1 end
    end
    return 0
  end
  error("encode: allowed_special must be 'all' or a table of special tokens", 3)
end

local function raw_encode(self, text, opts, level)
  if type(text) ~= "string" then error("encode: expected a string, got " .. type(text), level + 1) end
  local replace = not (opts and opts.on_invalid_utf8 == "error") and 1 or 0
  if C.lt_tokenizer_encode(self.t, text, #text, allows(opts), replace, ids_box, n_box) ~= 0 then fail(level + 1) end
  return ids_box[0], tonumber(n_box[0])
end

--- tok:encode(text[, {allowed_special = "all" | {"<|endoftext|>"}, on_invalid_utf8 = "replace" | "error"}])
-- -> a Lua table of 0-based ids. <|endoftext|> is the special id only when allowed.
function Tokenizer:encode(text, opts)
  local p, n = raw_encode(self, text, opts, 2)
  local out = {}
  for i = 0, n - 1 do out[i + 1] = p[i] end
  C.lt_free(p)
  return out
end

--- tok:encode_tensor(text[, opts]) -> a 1-D i32 tensor of ids.
function Tokenizer:encode_tensor(text, opts)
  local p, n = raw_encode(self, text, opts, 2)
  local t = tensor.empty({ n }, { dtype = "i32" })
  if n > 0 then ffi.copy(t:data_ptr(), p, n * 4) end
  C.lt_free(p)
  return t
end

--- tok:encode_many({text, ...}[, {append_eot = true, ...}]) -> i32 tensor of all
-- ids, and a table of each document's end; documents are encoded on all threads.
function Tokenizer:encode_many(texts, opts)
  local n = #texts
  local ptrs = ffi.new("const char*[?]", math.max(n, 1))
  local lens = ffi.new("size_t[?]", math.max(n, 1))
  for i = 1, n do
    ptrs[i - 1] = texts[i]
    lens[i - 1] = #texts[i]
  end
  local ends = ffi.new("int64_t[?]", math.max(n, 1))
  local replace = not (opts and opts.on_invalid_utf8 == "error") and 1 or 0
  local eot = not (opts and opts.append_eot == false) and 1 or 0
  if C.lt_tokenizer_encode_many(self.t, n, ptrs, lens, allows(opts), replace, eot, ids_box, n_box, ends) ~= 0 then
    fail(2)
  end
  local total = tonumber(n_box[0])
  local t = tensor.empty({ total }, { dtype = "i32" })
  if total > 0 then ffi.copy(t:data_ptr(), ids_box[0], total * 4) end
  C.lt_free(ids_box[0])
  local doc_ends = {}
  for i = 1, n do doc_ends[i] = tonumber(ends[i - 1]) end
  return t, doc_ends
end

-- The length of the UTF-8 character lead byte c starts and the range of its
-- second byte (Unicode's table 3-7: no overlong forms, no surrogates, nothing
-- past U+10FFFF); nil where no character starts with c.
local function utf8_lead(c)
  if c < 0x80 then return 1 end
  if c >= 0xC2 and c <= 0xDF then return 2, 0x80, 0xBF end
  if c == 0xE0 then return 3, 0xA0, 0xBF end
  if c == 0xED then return 3, 0x80, 0x9F end
  if c >= 0xE1 and c <= 0xEF then return 3, 0x80, 0xBF end
  if c == 0xF0 then return 4, 0x90, 0xBF end
  if c >= 0xF1 and c <= 0xF3 then return 4, 0x80, 0xBF end
  if c == 0xF4 then return 4, 0x80, 0x8F end
end

--- lt.tokenizer.replace_invalid_utf8(s) -> s with each ill-formed UTF-8
-- sequence (each maximal subpart of one, as Unicode 15 section 3.9 counts
-- them) replaced by U+FFFD: what Python's bytes.decode("utf-8",
-- errors="replace"), and so tiktoken's decode, gives. A valid s comes back
-- as it is.
function M.replace_invalid_utf8(s)
  local out, i, n, run = {}, 1, #s, 1 -- run: where the valid bytes not yet copied start
  while i <= n do
    local len, lo, hi = utf8_lead(s:byte(i))
    local good = len ~= nil -- a whole valid character at i, else `bad` bytes to replace
    local bad = 1
    if len and len > 1 then
      local j = 1
      while j < len do
        local b = s:byte(i + j)
        if not b or b < (j == 1 and lo or 0x80) or b > (j == 1 and hi or 0xBF) then break end
        j = j + 1
      end
      good, bad = j == len, j
    end
    if good then
      i = i + len
    else
      out[#out + 1] = s:sub(run, i - 1)
      out[#out + 1] = "\239\191\189" -- U+FFFD
      i = i + bad
      run = i
    end
  end
  if run == 1 then return s end
  out[#out + 1] = s:sub(run)
  return table.concat(out)
end

local function errors_opt(opts, what)
  if opts == nil then return false end
  if type(opts) ~= "table" or (opts.errors ~= nil and opts.errors ~= "replace" and opts.errors ~= "keep") then
    error(what .. ": options are {errors = \"replace\" or \"keep\"}", 3)
  end
  return opts.errors == "replace"
end

--- tok:decode(ids[, {errors = "keep"}]) -> the text. ids is a table of ids or
-- an integer tensor. errors = "keep" (the default) gives the bytes as they
-- are (a cut mid-character stays cut: what tiktoken's decode_bytes gives);
-- "replace" replaces ill-formed UTF-8 with U+FFFD (tiktoken's decode).
function Tokenizer:decode(ids, opts)
  local replace = errors_opt(opts, "decode")
  local n, buf
  if tensor.is_tensor(ids) then
    local t = ids:to("cpu", "i32"):contiguous()
    n = t:numel()
    buf = t:data_ptr()
  elseif type(ids) == "table" then
    n = #ids
    buf = ffi.new("int32_t[?]", math.max(n, 1))
    for i = 1, n do
      local v = ids[i]
      if type(v) ~= "number" or v ~= math.floor(v) then
        error(("decode: id %d is %s, expected a whole number"):format(i, tostring(v)), 2)
      end
      buf[i - 1] = v
    end
  else
    error("decode: expected a table of ids or a tensor", 2)
  end
  if C.lt_tokenizer_decode(self.t, buf, n, bytes_box, len_box) ~= 0 then fail(2) end
  local s = ffi.string(bytes_box[0], len_box[0])
  C.lt_free(bytes_box[0])
  return replace and M.replace_invalid_utf8(s) or s
end

--- Bytes at the end of s that start a UTF-8 character not yet complete
-- (bytes that can never become one, such as 0xFF or 0xE0 0x80, are not held).
local function incomplete_tail(s)
  local n = #s
  for back = 1, math.min(3, n) do
    local c = s:byte(n - back + 1)
    if c < 0x80 then return 0 end
    if c >= 0xC0 then -- a lead byte: a character that needs more than we have, so far well formed?
      local len, lo, hi = utf8_lead(c)
      if not len or len <= back then return 0 end
      for j = 1, back - 1 do
        local b = s:byte(n - back + 1 + j)
        if b < (j == 1 and lo or 0x80) or b > (j == 1 and hi or 0xBF) then return 0 end
      end
      return back
    end
  end
  return 0
end

--- tok:decoder([{errors = "keep"}]) -> a streaming decoder: d:push(id)
-- returns the text that is complete so far (an incomplete UTF-8 character
-- waits for the next ids); d:flush() returns what is left. errors as
-- tok:decode's ("replace": what comes out is valid UTF-8).
function Tokenizer:decoder(opts)
  local tok, pending = self, ""
  local clean = errors_opt(opts, "decoder") and M.replace_invalid_utf8 or function(s) return s end
  local d = {}
  function d:push(id)
    local s = pending .. tok:decode { id }
    local hold = incomplete_tail(s)
    pending = s:sub(#s - hold + 1)
    return clean(s:sub(1, #s - hold))
  end
  function d:flush()
    local s = pending
    pending = ""
    return clean(s)
  end
  return d
end

return M
