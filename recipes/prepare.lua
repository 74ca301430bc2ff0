--- recipes/prepare.lua: text -> token shards (llm.c's format) for training.
-- The input is a directory of .txt files (each file one document, in
-- sorted order) or a .jsonl file (one document per line, the text in
-- --field), or a single text file. Each document is encoded with GPT-2's
-- BPE on all threads and followed by <|endoftext|>; documents go to the
-- validation split deterministically (one in every 1/val_frac), the rest to
-- training. A single text file is cut in two at a line boundary, as
-- nanoGPT's prepare scripts split one text: its first 1 - val_frac of the
-- bytes (up to the end of a line) train, the rest validates, each part a
-- document; a file of one line, or whose training part would be empty, is
-- refused (training would get no tokens);
-- each split is cut into shards of --shard_size tokens named
-- <out>/train_000000.bin, <out>/val_000000.bin, ... The output depends only
-- on the input and the settings. An --out that holds anything is refused
-- (old shards there would be read with the new ones) unless --overwrite,
-- which deletes its train_*.bin and val_*.bin first.
--
--   ./lutra recipes/prepare.lua --input=/usr/share/doc/python3.11/html/_sources --out=data/pydocs
local lt = require "lutra"

local cfg = lt.config {
  input = "/usr/share/doc/python3.11/html/_sources",
  out = "data/pydocs",
  vocab = "data/gpt2.tiktoken",
  vocab_sha256 = "", -- "": GPT-2's for a file named gpt2.tiktoken; "any"; or 64 hex digits
  shard_size = 10000000, -- tokens per shard
  val_frac = 0.02,
  field = "text", -- for .jsonl input
  batch_mb = 8, -- text encoded per parallel batch
  on_invalid_utf8 = "error", -- or "replace" (with U+FFFD)
  overwrite = false, -- into an --out that is not empty: its old shards deleted
  quiet = false,
  _help = {
    input = "a directory of .txt files (one document each), a .jsonl file (one per line) or one text file (cut in two)",
    out = "the directory for train_*.bin and val_*.bin", vocab = "GPT-2's BPE vocabulary (tiktoken format)",
    vocab_sha256 = "the vocabulary's SHA-256: empty for GPT-2's where the file is named gpt2.tiktoken, any for no check",
    shard_size = "tokens per shard", val_frac = "the share of documents for validation (one in every 1/val_frac; of one text file's bytes)",
    field = "the text's field in each .jsonl line", batch_mb = "MB of text encoded per parallel batch",
    on_invalid_utf8 = "error, or replace (with U+FFFD)", quiet = "no progress line",
    overwrite = "write into a non-empty --out, deleting its train_*.bin and val_*.bin first",
  },
}

-- every setting checked before anything is read or written; a bad setting
-- or input is a settings error (the message alone, without a traceback)
local fail = lt.config.fail
lt.config.refuse_args(cfg) -- ("steps=3", without --)
lt.config.check(cfg, {
  input = { nonempty = true }, out = { nonempty = true }, vocab = { nonempty = true }, field = { nonempty = true },
  shard_size = { int = true, min = 1 }, val_frac = { gt = 0, max = 0.5, why = "the share for validation: one document in every 1/val_frac, at most every other one" }, batch_mb = { gt = 0 },
  on_invalid_utf8 = { one_of = { "error", "replace" } },
})

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

--- One text's two parts {train, val}, cut at the end of the line holding
-- byte (1 - val_frac) * #text (at least one line on each side); nil, why
-- where no cut leaves text on both sides.
local function cut_text(text, val_frac)
  local at = math.floor(#text * (1 - val_frac))
  local eol = text:find("\n", math.max(at, 1), true)
  if eol == #text then eol = nil end -- (the last line: try the line before it)
  if not eol then
    local before = text:sub(1, math.max(at, 1)):match("^.*()\n")
    eol = before and before < #text and before or nil
  end
  if not eol then return nil, "a single line, which cannot be cut into a training and a validation part" end
  local train, val = text:sub(1, eol), text:sub(eol + 1)
  if not train:match("%S") then return nil, "no text before its validation part" end
  if not val:match("%S") then return nil, "no text after its training part" end
  return train, val
end

--- The documents as a list of {name =, read = function() -> text[, split =]}.
local function documents(input)
  local docs = {}
  local probe = io.open(input, "rb")
  local rc = os.execute("test -d " .. shell_quote(input))
  local is_dir = rc == 0 or rc == true
  if is_dir then
    local p = io.popen("LC_ALL=C find " .. shell_quote(input) .. " -type f -name '*.txt' | LC_ALL=C sort")
    for path in p:lines() do
      docs[#docs + 1] = { name = path, read = function()
        local f = assert(io.open(path, "rb"))
        local t = f:read("*a")
        f:close()
        return t
      end }
    end
    p:close()
    if #docs == 0 then fail(("prepare: no .txt files under %s"):format(input)) end
  elseif not probe then
    fail(("prepare: cannot open %s"):format(input))
  elseif input:match("%.jsonl$") then
    local n = 0
    for line in probe:lines() do
      n = n + 1
      if line:match("%S") then
        local ok, obj = pcall(lt.json.decode, line)
        if not ok or type(obj) ~= "table" or type(obj[cfg.field]) ~= "string" then
          fail(("prepare: %s line %d: not a JSON object with a string field '%s'"):format(input, n, cfg.field))
        end
        local text = obj[cfg.field]
        docs[#docs + 1] = { name = ("%s:%d"):format(input, n), read = function() return text end }
      end
    end
    if #docs == 0 then fail(("prepare: %s holds no documents (%d lines, none with text)"):format(input, n)) end
  else
    local text = probe:read("*a")
    probe:close()
    local train, val = cut_text(text, cfg.val_frac)
    if not train then
      fail(("prepare: %s holds %s: training would get 0 tokens; give a longer text, a directory of .txt files or a .jsonl file (one document per line)")
        :format(input, val))
    end
    return { { name = input .. " (training part)", read = function() return train end, split = "train" },
      { name = input .. " (validation part)", read = function() return val end, split = "val" } }
  end
  if probe then probe:close() end
  return docs
end

--- The names in dir (none for a directory that is not there); raises if
-- out is there but is not a directory.
local function entries(dir)
  local rc = os.execute("test -e " .. shell_quote(dir))
  if not (rc == 0 or rc == true) then return {} end
  rc = os.execute("test -d " .. shell_quote(dir))
  if not (rc == 0 or rc == true) then fail(("prepare: --out=%s is not a directory"):format(dir)) end
  local names = {}
  local p = io.popen("LC_ALL=C ls -A " .. shell_quote(dir))
  for name in p:lines() do names[#names + 1] = name end
  p:close()
  return names
end

--- Refuses a non-empty --out unless --overwrite, which deletes the old
-- shards (only those: other files stay).
local function prepare_out(out)
  local names = entries(out)
  if #names > 0 and not cfg.overwrite then
    local shown = {}
    for k = 1, math.min(3, #names) do shown[k] = names[k] end
    fail(("prepare: --out=%s is not empty (%d entries: %s%s); shards already there would be read with the new ones: pass --overwrite to delete its train_*.bin and val_*.bin first, or give another --out")
      :format(out, #names, table.concat(shown, ", "), #names > 3 and ", ..." or ""))
  end
  for _, name in ipairs(names) do
    if name:match("^train_%d+%.bin$") or name:match("^val_%d+%.bin$") then
      local ok, err = os.remove(out .. "/" .. name)
      if not ok then fail(("prepare: --overwrite: cannot delete %s/%s: %s"):format(out, name, tostring(err))) end
    end
  end
  os.execute("mkdir -p " .. shell_quote(out))
end

local want_sha256 = nil -- (tokenizer.load's rule)
if cfg.vocab_sha256 == "any" then want_sha256 = false elseif cfg.vocab_sha256 ~= "" then want_sha256 = cfg.vocab_sha256 end
local ok_tok, tok = pcall(lt.tokenizer.load, cfg.vocab, { sha256 = want_sha256 })
if not ok_tok then -- (in the terms of this recipe's settings)
  local msg = tostring(tok):gsub("^tokenizer%.load: ", ""):gsub("load it with {sha256 = false}", "pass --vocab_sha256=any")
    :gsub("sha256 must be 64 hex digits or false", "--vocab_sha256 must be 64 hex digits, any or empty")
  fail("prepare: " .. msg)
end
local docs = documents(cfg.input)
if #docs == 1 then
  -- documents go whole to one split, the first to validation: training would get nothing
  fail(("prepare: %s is a single document, which goes whole to the validation split, leaving 0 training tokens; give several documents (a directory of .txt files, a .jsonl file of several lines) or the text as one file, which is cut in two")
    :format(docs[1].name))
end
prepare_out(cfg.out)

local every = math.max(2, math.floor(1 / cfg.val_frac + 0.5))
local splits = {
  train = { buf = {}, n = 0, shard = 0, total = 0 },
  val = { buf = {}, n = 0, shard = 0, total = 0 },
}

local function flush(name, final)
  local s = splits[name]
  while s.n >= cfg.shard_size or (final and s.n > 0) do
    local all = lt.cat(s.buf, 1)
    local take = math.min(s.n, cfg.shard_size)
    local path = ("%s/%s_%06d.bin"):format(cfg.out, name, s.shard)
    lt.data.write_shard(path, all:narrow(1, 1, take), tok.n_vocab)
    s.shard = s.shard + 1
    s.total = s.total + take
    s.buf = take < s.n and { all:narrow(1, take + 1, s.n - take):clone() } or {}
    s.n = s.n - take
  end
end

local start = lt.clock()
local bytes_done, tokens_done = 0, 0

-- on a terminal the progress line redraws itself; into a log (not a
-- terminal) it is a line of its own at each tenth of the documents
local ffi = require "ffi"
pcall(ffi.cdef, "int isatty(int fd);")
local on_terminal = ffi.C.isatty(2) == 1
local last_tenth, last_i = -1, -1

local function progress(i, final)
  if cfg.quiet then return end
  local secs = math.max(lt.clock() - start, 1e-9)
  local frac = i / #docs
  local tenth = math.floor(frac * 10)
  -- (into a log: nothing printed twice for one document count, nor twice in one tenth but the last)
  if not on_terminal and (last_i == i or (not final and tenth == last_tenth)) then return end
  last_tenth, last_i = tenth, i
  local bar = string.rep("#", math.floor(frac * 30)) .. string.rep(".", 30 - math.floor(frac * 30))
  io.stderr:write(("%s[%s] %d/%d documents, %.1f MB, %d tokens, %.0f tokens/s%s"):format(on_terminal and "\r" or "",
    bar, i, #docs, bytes_done / 1e6, tokens_done, tokens_done / secs, on_terminal and "" or "\n"))
  if final and on_terminal then io.stderr:write("\n") end
end

local i = 1
while i <= #docs do
  -- a batch of documents of about batch_mb, all in the same split or not
  local texts, names, which = {}, {}, {}
  local size = 0
  while i <= #docs and (size < cfg.batch_mb * 1e6 or #texts == 0) do
    local text = docs[i].read()
    texts[#texts + 1] = text
    names[#names + 1] = docs[i].name
    which[#which + 1] = docs[i].split or (((i - 1) % every == 0) and "val" or "train")
    size = size + #text
    i = i + 1
  end
  local ok, ids, ends = pcall(tok.encode_many, tok, texts, { on_invalid_utf8 = cfg.on_invalid_utf8 })
  if not ok then
    local d = tonumber(tostring(ids):match("document (%d+)"))
    fail(("prepare: %s: %s"):format(d and names[d] or "a document", tostring(ids):gsub("^.-document %d+: ", "")))
  end
  local from = 0
  for k = 1, #texts do
    local part = ids:narrow(1, from + 1, ends[k] - from)
    local s = splits[which[k]]
    s.buf[#s.buf + 1] = part
    s.n = s.n + part:numel()
    from = ends[k]
  end
  bytes_done = bytes_done + size
  tokens_done = tokens_done + ids:numel()
  flush("train")
  flush("val")
  progress(i - 1)
end
flush("train", true)
flush("val", true)
progress(#docs, true)
if not cfg.quiet then
  print(("prepare: %d documents -> %d train tokens in %d shard(s), %d val tokens in %d shard(s) under %s")
    :format(#docs, splits.train.total, splits.train.shard, splits.val.total, splits.val.shard, cfg.out))
end
