--- lutra.models (lt.models): model constructors by family.
return {
  gpt2 = require("lutra.models.gpt2").gpt2,
  llama = require("lutra.models.llama").llama,
}
