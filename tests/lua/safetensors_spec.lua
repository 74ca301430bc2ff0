-- tests/lua/safetensors_spec.lua: lt.save / lt.load round trips, a file
-- written by the reference safetensors library (tests/ref/gen_safetensors.py),
-- and malformed files, each rejected with a message naming the file, the
-- tensor and the problem (the fuzz harness in tests/fuzz covers the rest).
local lt = require "lutra"
local H = require "tests.lua.helpers"

local function tmp() return os.tmpname() end

local function write_bytes(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

--- A safetensors image from a header (JSON text) and data bytes.
local function image(header, data)
  local n = #header
  local len = ""
  for _ = 1, 8 do
    len = len .. string.char(n % 256)
    n = math.floor(n / 256)
  end
  return len .. header .. (data or "")
end

describe("safetensors", function()
  it("round-trips every dtype, shape and metadata", function()
    local p = tmp()
    local src = {
      f32 = lt.randn(3, 4), f64 = lt.randn(2, { dtype = "f64" }), bf16 = lt.randn(5, { dtype = "bf16" }),
      f16 = lt.randn(2, 2, { dtype = "f16" }), i64 = lt.arange(7), i32 = lt.arange(3, "i32"),
      u8 = lt.tensor({ 1, 255 }, "u8"), u16 = lt.tensor({ 65535 }, "u16"), i8 = lt.tensor({ -128, 127 }, "i8"),
      bool = lt.tensor({ true, false }, "bool"), empty = lt.zeros(0, 5), scalar = lt.tensor(3.25),
      view = lt.arange(12, "f32"):view(3, 4):t(), -- non-contiguous, saved as it reads
    }
    lt.save(p, src, { step = "100", note = "hello" })
    local got, meta = lt.load(p)
    assert.are.same({ step = "100", note = "hello" }, meta)
    for k, v in pairs(src) do
      assert.are.equal(v.dtype, got[k].dtype, k)
      assert.are.same(v:shape(), got[k]:shape(), k)
      assert.are.same(v:totable(), got[k]:totable(), k)
    end
    local r = lt.safetensors.open(p)
    assert.are.equal(13, #r:names())
    assert.are.same({ { 0, 4, 8 }, { 1, 5, 9 } }, r:get("view"):narrow(1, 1, 2):narrow(2, 1, 3):totable())
    r:close()
    os.remove(p)
  end)
  it("reads what the reference library wrote", function()
    local want = H.load_json("tests/ref/reference_safetensors.json")
    local got, meta = lt.load("tests/ref/reference.safetensors")
    assert.are.equal("made by safetensors", meta.note)
    for name, w in pairs(want) do
      assert.truthy(got[name], name)
      assert.are.same(w.shape, got[name]:shape(), name)
      local flat = got[name]:numel() > 0 and got[name]:reshape(-1):to("f64"):totable() or {}
      for i = 1, #w.values do assert.are.equal(w.values[i], flat[i], name .. " " .. i) end
    end
    assert.are.equal("bf16", got.brain.dtype)
    assert.are.equal("bool", got.mask.dtype)
  end)
  it("writes atomically and refuses what it cannot hold", function()
    local p = tmp()
    H.assert_error(function() lt.save(p, { x = 5 }) end, "'x'", "not a tensor")
    H.assert_error(function() lt.save(p, { [1] = lt.zeros(1) }) end, "names must be strings")
    H.assert_error(function() lt.save(p, { x = lt.zeros(1) }, { step = 3 }) end, "strings")
    H.assert_error(function() lt.save("/nonexistent/dir/x.safetensors", { x = lt.zeros(1) }) end, "cannot create")
    local f = io.open(p, "rb")
    assert.are.equal("", f:read("*a")) -- the failed saves left the (empty, os.tmpname) file untouched
    f:close()
    os.remove(p)
  end)
  it("rejects malformed files, naming the problem", function()
    local data8 = string.rep("\0", 8)
    local cases = {
      { "", "too short" },
      { "\1\2\3", "too short" },
      { string.rep("\255", 8) .. "{}", "runs past the end" },
      { image("[1,2]"), "JSON object" },
      { image("{\"a\": "), "not valid JSON" },
      { image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', data8), nil },
      { image('{"a":{"dtype":"Q8","shape":[2],"data_offsets":[0,8]}}', data8), "dtype 'Q8'" },
      { image('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', data8), "whole number" },
      { image('{"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}', data8), "whole number" },
      { image('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', data8), "need 12" },
      { image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', "\0\0"), "ends at byte 8" },
      { image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}}', data8), "begin <= end" },
      -- offsets far outside uint64_t: range-checked before the conversion (UBSan: float-cast-overflow)
      { image('{"a":{"dtype":"F32","shape":[0],"data_offsets":[1e30,1e30]}}'), "ends at byte 1e+30 of a" },
      { image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,1e30]}}', data8), "ends at byte 1e+30 of a" },
      { image('{"a":{"dtype":"F32","shape":[2],"data_offsets":[-1e30,8]}}', data8), "begin <= end" },
      { image('{"a":{"dtype":"F32","shape":[1e30],"data_offsets":[0,8]}}', data8), "whole number" },
      { image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}', data8), "overlaps" },
      { image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', data8), "belong to no tensor" },
      { image('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', data8), "cover 4" },
      { image('{"a":{"dtype":"F32","shape":[1]}}', data8), "data_offsets" },
      { image('{"__metadata__":{"k":1}}'), "not a string" },
      { image('{"a":{"dtype":"F32","shape":[1000000000000000,100000],"data_offsets":[0,8]}}', data8), "too many" },
      { image('{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}', "\0\0\0\0"), "dims" },
    }
    local p = tmp()
    for i, c in ipairs(cases) do
      write_bytes(p, c[1])
      if c[2] then
        local err = H.assert_error(function() return lt.load(p) end, "safetensors", p, c[2])
        assert.truthy(err, "case " .. i)
      else
        assert.are.same({ 0, 0 }, lt.load(p).a:totable(), "case " .. i)
      end
    end
    os.remove(p)
    H.assert_error(function() return lt.load("/nonexistent.safetensors") end, "cannot open")
    H.assert_error(function() return lt.safetensors.open(p .. "x"):get("a") end, "cannot open")
  end)
end)
