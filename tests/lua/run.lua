-- tests/lua/run.lua: runs the busted specs under lutra itself, so the specs
-- see lutra's embedded library and FFI symbols exactly as recipes do.
--   ./lutra tests/lua/run.lua [busted options] [paths]
-- Busted signals failures under Lua 5.1 by raising a nil error; that becomes
-- exit status 1 here without a spurious message.
local ok, err = pcall(require "busted.runner", { standalone = false })
if not ok then
  if err ~= nil then io.stderr:write(tostring(err), "\n") end
  os.exit(1)
end
