--- lutra.strict: strict globals for recipes.
-- A recipe chunk runs in an environment that reads through to _G but makes
-- reading an undeclared global, or assigning any new global, an error that
-- names it (typos in recipes fail loudly instead of giving nil). Libraries
-- loaded with require keep the ordinary _G. The REPL and -e code are not
-- strict.
local M = {}

local function make_env()
  local env = {}
  return setmetatable(env, {
    __index = function(_, name)
      local v = _G[name]
      if v == nil then
        error(("read of undeclared global '%s' (declare it with local)"):format(tostring(name)), 2)
      end
      return v
    end,
    __newindex = function(_, name)
      error(("assignment to undeclared global '%s' (declare it with local, or use rawset(_G, name, value))")
        :format(tostring(name)), 2)
    end,
  })
end

--- Gives the function `chunk` (a loaded recipe) a strict environment.
function M.apply(chunk)
  setfenv(chunk, make_env())
  return chunk
end

return M
