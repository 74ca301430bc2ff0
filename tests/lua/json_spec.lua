-- tests/lua/json_spec.lua: lt.json (cJSON) round trips and rejects bad text
-- with the byte offset.
local lt = require "lutra"
local H = require "tests.lua.helpers"

describe("lt.json", function()
  it("decodes objects, arrays, numbers, strings, booleans and null", function()
    local v = lt.json.decode('{"a": [1, 2.5, -3e2], "b": {"c": "x\\u00e9"}, "t": true, "n": null}')
    assert.are.same({ 1, 2.5, -300 }, v.a)
    assert.are.equal("x\195\169", v.b.c)
    assert.is_true(v.t)
    assert.are.equal(lt.json.null, v.n)
  end)
  it("encodes deterministically and round trips", function()
    local text = lt.json.encode { b = 1, a = { 1, 2, { x = false } }, s = "q\"" }
    assert.are.equal('{"a":[1,2,{"x":false}],"b":1,"s":"q\\""}', text)
    assert.are.same({ b = 1, a = { 1, 2, { x = false } }, s = "q\"" }, lt.json.decode(text))
    assert.are.equal("{}", lt.json.encode {})
  end)
  it("rejects bad text and unencodable values", function()
    H.assert_error(function() return lt.json.decode('{"a": [1, 2') end, "json.decode", "byte")
    H.assert_error(function() return lt.json.decode('{} x') end, "after the value")
    H.assert_error(function() return lt.json.encode { 0 / 0 } end, "NaN")
    H.assert_error(function() return lt.json.encode { print } end, "function")
    H.assert_error(function() return lt.json.encode { [1] = 1, x = 2 } end, "neither an array")
    local cyc = {}
    cyc.self = cyc
    H.assert_error(function() return lt.json.encode(cyc) end, "deep")
  end)
end)
