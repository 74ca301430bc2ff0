-- tests/lua/modules_spec.lua: the Lua library's module graph. Every module
-- of lua/lutra loads on its own in a fresh lutra process (a cycle in the
-- graph fails there: Lua's require reports the loop), without the umbrella
-- "lutra" (which only assembles the public lt table from the others), and
-- every require sits at the top level of its module (none inside a
-- function to break a loop at run time). ARCHITECTURE.md's Lua layer table
-- lists every module, and each requires only modules of the layers above
-- it or before it in its row.
local sh = require("tests.lua.helpers").sh

-- module names from the files: lua/lutra/nn/init.lua -> lutra.nn
local function modules()
  local p = assert(io.popen("find lua/lutra -name '*.lua' | sort"))
  local out = {}
  for path in p:lines() do
    local name = path:gsub("^lua/", ""):gsub("%.lua$", ""):gsub("/init$", ""):gsub("/", ".")
    out[#out + 1] = { name = name, path = path }
  end
  p:close()
  return out
end

-- a script run as a file (-e would load the umbrella for lt): requires one
-- module with `require` wrapped to refuse "lutra", then checks that the
-- umbrella was not loaded some other way
local probe = [[
local name = ...
local real = require
rawset(_G, "require", function(m)
  if m == "lutra" then error(name .. " requires the umbrella \"lutra\"", 2) end
  return real(m)
end)
real(name)
if package.loaded["lutra"] ~= nil then error(name .. " loaded the umbrella \"lutra\"") end
print("loaded " .. name)
]]

describe("the Lua library's modules", function()
  local list = modules()
  it("are found", function()
    assert.truthy(#list >= 30, #list)
  end)
  it("each load on their own, without the umbrella and without cycles", function()
    local f = os.tmpname()
    local h = assert(io.open(f, "w"))
    h:write(probe)
    h:close()
    local bad = {}
    for _, m in ipairs(list) do
      if m.name ~= "lutra" then
        local out, rc = sh(("./lutra %s %s 2>&1"):format(f, m.name))
        if rc ~= 0 or not out:find("loaded " .. m.name, 1, true) then bad[#bad + 1] = m.name .. ": " .. out end
      end
    end
    os.remove(f)
    assert.are.equal("", table.concat(bad, "\n"))
  end)
  it("require at their top level only", function()
    local bad = {}
    for _, m in ipairs(list) do
      local n = 0
      for line in io.lines(m.path) do
        n = n + 1
        local code = line:gsub("%-%-.*$", "")
        if code:find("^%s+") and code:find("require%s*[%(\"']") then
          bad[#bad + 1] = ("%s:%d: %s"):format(m.path, n, line)
        end
      end
    end
    assert.are.equal("", table.concat(bad, "\n"))
  end)
  it("the umbrella gives the same lt as the modules do", function()
    local lt = require "lutra"
    assert.are.equal(require "lutra.dist", lt.dist)
    assert.are.equal(require "lutra.optim", lt.optim)
    assert.are.equal(require "lutra.train", lt.train)
    assert.are.equal(require("lutra.tensor").zeros, lt.zeros)
  end)
end)

-- ARCHITECTURE.md's Lua layer table ("| layer | modules | provides |"): each
-- module's position, (layer, entry, place in its "a → b" chain); a module
-- may require those of lower layers and those before it in its own row
local function layer_table()
  local h = assert(io.open("ARCHITECTURE.md"))
  local text = h:read("*a")
  h:close()
  local pos, in_table = {}, false
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    if line:find("^| layer | modules |") then
      in_table = true
    elseif in_table and not line:find("^|") then
      break
    elseif in_table and line:find("^| %d") then
      local n, mods = line:match("^| (%d+) | ([^|]*) |")
      local e = 0
      for entry in (mods .. ","):gmatch("([^,]*),") do
        e = e + 1
        local c = 0
        for name in entry:gmatch("`([^`]+)`") do
          c = c + 1
          pos[name] = { tonumber(n), e, c }
        end
      end
    end
  end
  return pos
end

local function before(a, b) -- a strictly before b in the table's order
  for i = 1, 3 do
    if a[i] ~= b[i] then return a[i] < b[i] end
  end
  return false
end

describe("ARCHITECTURE.md's Lua layer table", function()
  it("lists every module, each requiring only modules above it or before it in its row", function()
    local pos, bad = layer_table(), {}
    assert.truthy(next(pos) ~= nil, "no layer table found in ARCHITECTURE.md")
    for _, m in ipairs(modules()) do
      local short = m.name == "lutra" and "lutra" or m.name:gsub("^lutra%.", "")
      local at = pos[short]
      if not at then
        bad[#bad + 1] = short .. " (" .. m.path .. ") is in no layer of the table"
      else
        for line in io.lines(m.path) do
          local code = line:gsub("%-%-.*$", "")
          for req in code:gmatch("require%s*%(?%s*[\"']lutra%.([%w_.]+)[\"']") do
            local to = pos[req]
            if to and not before(to, at) then
              bad[#bad + 1] = ("%s (layer %d) requires %s (layer %d), not above it"):format(short, at[1], req, to[1])
            end
          end
        end
      end
    end
    assert.are.equal("", table.concat(bad, "\n"))
  end)
end)
