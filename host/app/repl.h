/*
 * repl.h: the interactive loop (repl.c) and the protected call that main.c
 * and the REPL share (traceback handler, SIGINT turned into "interrupted!").
 */
#ifndef LUTRA_REPL_H
#define LUTRA_REPL_H

#include <lua.h>

/* Calls the function below nargs arguments on the stack with a traceback
   handler and SIGINT armed; leaves nres results (LUA_MULTRET allowed) or the
   error message. Returns the lua_pcall status. */
int lt_docall(lua_State *L, int nargs, int nres);

/* Prints the error message on top of the stack to stderr and pops it. */
void lt_report(lua_State *L, int status);

/* Runs the read-eval-print loop until end of input. With a terminal it edits
   lines through libedit, keeps history in ~/.lutra_history and completes on
   TAB; piped input is read silently (no prompts). Returns how many chunks
   raised an error (the exit status is 1 when piped input had any, as a
   script's would be; at a terminal errors are only reported). */
int lt_repl(lua_State *L);

#endif
