-- tests/lua/helpers.lua: shared pieces of the Lua specs: reading the PyTorch
-- fixtures (tests/ref/*.json), building tensors from their specs, and
-- comparing results with dtype-aware tolerances.
local lt = require "lutra"

local H = {}

--- Fixture numbers: "nan"/"inf"/"-inf" strings back to numbers.
function H.num(v)
  if v == "nan" then return 0 / 0 end
  if v == "inf" then return math.huge end
  if v == "-inf" then return -math.huge end
  return v
end

function H.load_json(path)
  local f = assert(io.open(path, "rb"), "cannot open " .. path)
  local text = f:read("*a")
  f:close()
  return lt.json.decode(text)
end

--- A tensor of the given dtype and shape (and device, default cpu) from flat values.
function H.from_flat(vals, shape, dtype, device)
  local flat = {}
  for i = 1, #vals do flat[i] = H.num(vals[i]) end
  local opts = { dtype = dtype, device = device }
  if #shape == 0 then return lt.tensor(flat[1], opts) end
  return lt.tensor(flat, opts):reshape(shape)
end

--- Builds a fixture input on device (default cpu): its base tensor, then its
-- views (dims 0-based there), so a device sees the same strides.
function H.build(spec, device)
  local t = H.from_flat(spec.values, spec.shape, spec.dtype, device)
  for _, v in ipairs(spec.views or {}) do
    local op = v[1]
    if op == "transpose" then t = t:transpose(v[2] + 1, v[3] + 1)
    elseif op == "narrow" then t = t:narrow(v[2] + 1, v[3] + 1, v[4])
    elseif op == "expand" then t = t:expand({ unpack(v, 2) })
    elseif op == "select" then t = t:select(v[2] + 1, v[3] + 1)
    elseif op == "permute" then
      local d = {}
      for i = 2, #v do d[#d + 1] = v[i] + 1 end
      t = t:permute(d)
    elseif op == "unsqueeze" then t = t:unsqueeze(v[2] + 1)
    else error("unknown view " .. op) end
  end
  return t
end

local TOL = { -- |a - e| <= rtol * |e| + atol
  f64 = { 1e-12, 1e-12 }, f32 = { 1e-5, 1e-6 }, bf16 = { 1 / 128, 1e-3 }, f16 = { 1 / 1024, 1e-4 },
}

local function flat_values(t)
  local n = t:numel()
  local out = {}
  if n == 0 then return out end
  local v = t:reshape(n):totable()
  for i = 1, n do out[i] = v[i] end
  return out
end
H.flat_values = flat_values

--- Checks actual against a fixture's expected {shape, dtype, values}; returns
-- true or false and a message naming the first mismatch.
function H.matches(actual, expected, tol_scale)
  local shape = actual:shape()
  if #shape ~= #expected.shape then
    return false, ("shape %s, expected %s"):format(table.concat(shape, ","), table.concat(expected.shape, ","))
  end
  for i = 1, #shape do
    if shape[i] ~= expected.shape[i] then
      return false, ("shape %s, expected %s"):format(table.concat(shape, ","), table.concat(expected.shape, ","))
    end
  end
  if actual.dtype ~= expected.dtype then
    return false, ("dtype %s, expected %s"):format(actual.dtype, expected.dtype)
  end
  local got = flat_values(actual)
  local tol = TOL[expected.dtype]
  for i = 1, #expected.values do
    local e, a = H.num(expected.values[i]), got[i]
    if type(a) == "boolean" then a = a and 1 or 0 end
    local ok
    if e ~= e then ok = a ~= a
    elseif e == math.huge or e == -math.huge then ok = a == e
    elseif tol then ok = math.abs(a - e) <= (tol[1] * math.abs(e) + tol[2]) * (tol_scale or 1)
    else ok = a == e end
    if not ok then
      return false, ("element %d: got %.17g, expected %.17g"):format(i, a, e)
    end
  end
  return true
end

--- Asserts a match inside a busted test.
function H.assert_matches(actual, expected, what, tol_scale)
  local ok, msg = H.matches(actual, expected, tol_scale)
  assert(ok, (what or "") .. ": " .. tostring(msg))
end

--- Asserts that fn raises an error whose message contains every fragment.
function H.assert_error(fn, ...)
  local ok, err = pcall(fn)
  assert(not ok, "expected an error, got none")
  err = tostring(err)
  for _, frag in ipairs { ... } do
    assert(err:find(frag, 1, true), ("error %q lacks %q"):format(err, frag))
  end
  return err
end

--- Deterministic pseudo-random numbers for specs (a small LCG, no lutra RNG).
function H.lcg(seed)
  local s = seed
  return function()
    s = (s * 1103515245 + 12345) % 2147483648
    return s / 2147483648
  end
end

--- Decodes standard base64.
function H.b64decode(s)
  local alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
  local val = {}
  for i = 1, 64 do val[alphabet:byte(i)] = i - 1 end
  local out, bits, nbits = {}, 0, 0
  for i = 1, #s do
    local v = val[s:byte(i)]
    if v then
      bits = bits * 64 + v
      nbits = nbits + 6
      if nbits >= 8 then
        nbits = nbits - 8
        local byte = math.floor(bits / 2 ^ nbits)
        out[#out + 1] = string.char(byte)
        bits = bits - byte * 2 ^ nbits
      end
    end
  end
  return table.concat(out)
end

--- Runs a shell command; returns its output (stdout and stderr) and exit status.
function H.sh(cmd)
  local p = io.popen("sh -c '" .. cmd:gsub("'", "'\\''") .. "' 2>&1; echo \"[rc=$?]\"")
  local out = p:read("*a")
  p:close()
  local rc = tonumber(out:match("%[rc=(%d+)%]%s*$"))
  return out:gsub("%[rc=%d+%]%s*$", ""), rc
end

return H
