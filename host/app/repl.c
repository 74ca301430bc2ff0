/*
 * repl.c: lutra's read-eval-print loop. Lines come from libedit (editing,
 * history in ~/.lutra_history, TAB completion of globals and fields) when
 * stdin is a terminal, or silently from a pipe. Each entry is tried first as
 * an expression ("return <line>"), then as a statement; an incomplete
 * statement asks for more lines. Values are printed and errors reported with
 * a traceback by lua/lutra/repl.lua, and the loop goes on. Ctrl-C at the
 * prompt discards the line; during a call it raises "interrupted!".
 */
#include "app/repl.h"
#include "lutra.h"

#include <editline/readline.h>
#include <lauxlib.h>
#include <luajit.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { HISTORY_MAX = 1000 };

static lua_State *repl_L;
static sigjmp_buf prompt_jump;
static volatile sig_atomic_t at_prompt;

static pthread_t repl_thread;

static void on_prompt_sigint(int sig) {
  /* The kernel hands a process's signal to any thread that does not block
     it, and libedit blocks signals while it redraws: then an OpenBLAS or
     OpenMP worker gets SIGINT, and jumping to the prompt from there would
     land on another thread's stack. Pass it on to the REPL's thread. */
  if (!pthread_equal(pthread_self(), repl_thread)) {
    pthread_kill(repl_thread, sig);
    return;
  }
  if (at_prompt)
    siglongjmp(prompt_jump, 1);
}

/* Calls require("lutra.repl")[fn] with the values above it; returns status. */
static int call_helper(lua_State *L, const char *fn, int nargs, int nres) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "lutra.repl");
  if (lua_pcall(L, 1, 1, 0) != 0)
    return 1;
  lua_getfield(L, -1, fn);
  lua_remove(L, -2);
  lua_insert(L, -(nargs + 1));
  return lua_pcall(L, nargs, nres, 0);
}

/* ---- completion ---------------------------------------------------------- */

static char **candidates;
static int ncandidates, next_candidate;

static char *candidate_generator(const char *text, int state) {
  (void)text;
  if (state == 0)
    next_candidate = 0;
  if (next_candidate < ncandidates)
    return strdup(candidates[next_candidate++]);
  return NULL;
}

static char **complete(const char *text, int start, int end) {
  (void)start;
  (void)end;
  rl_attempted_completion_over = 1; /* no file-name completion */
  for (int i = 0; i < ncandidates; i++)
    free(candidates[i]);
  free(candidates);
  candidates = NULL;
  ncandidates = 0;
  lua_State *L = repl_L;
  int top = lua_gettop(L);
  lua_pushstring(L, text);
  if (call_helper(L, "complete", 1, 1) == 0 && lua_istable(L, -1)) {
    int n = (int)lua_objlen(L, -1);
    candidates = calloc((size_t)n + 1, sizeof(char *));
    for (int i = 1; candidates && i <= n; i++) {
      lua_rawgeti(L, -1, i);
      const char *s = lua_tostring(L, -1);
      if (s)
        candidates[ncandidates++] = strdup(s);
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  if (ncandidates == 0)
    return NULL;
  return rl_completion_matches(text, candidate_generator);
}

/* ---- input --------------------------------------------------------------- */

/* Reads one line without its newline (malloc'd), or NULL at end of input. */
static char *read_line(int tty, const char *prompt) {
  if (tty) {
    char *line = readline(prompt);
    return line;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t n = getline(&line, &cap, stdin);
  if (n < 0) {
    free(line);
    return NULL;
  }
  if (n > 0 && line[n - 1] == '\n')
    line[n - 1] = 0;
  return line;
}

static int incomplete(lua_State *L, int status) {
  if (status != LUA_ERRSYNTAX)
    return 0;
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  const char *eof = "'<eof>'";
  size_t elen = strlen(eof);
  return msg && len >= elen && strcmp(msg + len - elen, eof) == 0;
}

/* Compiles the entry in buf, reading more lines while it is incomplete.
   Leaves the chunk (or an error message) on the stack; returns the status,
   or -1 at end of input. *text receives the full entry for the history. */
static int load_entry(lua_State *L, int tty, char **text) {
  char *line = read_line(tty, "> ");
  if (!line)
    return -1;
  size_t cap = strlen(line) + 1;
  char *buf = malloc(cap);
  strcpy(buf, line);
  free(line);
  if (buf[0] == '=') { /* "=expr" prints expr, as in lua 5.1 */
    buf[0] = ' ';
  }
  for (;;) {
    /* an expression first, so its value can be printed */
    size_t n = strlen(buf);
    char *ret = malloc(n + 32);
    snprintf(ret, n + 32, "return %s", buf);
    int st = luaL_loadbuffer(L, ret, strlen(ret), "=stdin");
    if (st == 0) {
      /* run it as select(1, <expr>): the same values, but a call in the entry
         is no longer a tail call, so errors keep their "stdin:1:" position */
      lua_pop(L, 1);
      snprintf(ret, n + 32, "return select(1, %s\n)", buf);
      st = luaL_loadbuffer(L, ret, strlen(ret), "=stdin");
      if (st != 0) { /* cannot happen for an expression; keep the plain form */
        lua_pop(L, 1);
        snprintf(ret, n + 32, "return %s", buf);
        st = luaL_loadbuffer(L, ret, strlen(ret), "=stdin");
      }
    }
    free(ret);
    if (st == 0) {
      *text = buf;
      return 0;
    }
    lua_pop(L, 1);
    st = luaL_loadbuffer(L, buf, n, "=stdin");
    if (!incomplete(L, st)) {
      *text = buf;
      return st;
    }
    lua_pop(L, 1);
    char *more = read_line(tty, ">> ");
    if (!more) { /* end of input inside a statement: report it */
      luaL_loadbuffer(L, buf, n, "=stdin");
      *text = buf;
      return LUA_ERRSYNTAX;
    }
    size_t m = strlen(more);
    buf = realloc(buf, n + m + 2);
    buf[n] = '\n';
    memcpy(buf + n + 1, more, m + 1);
    free(more);
  }
}

__attribute__((noinline)) static const char *history_path(void) {
  static char path[4096];
  const char *home = getenv("HOME");
  if (!home || !*home)
    return NULL;
  snprintf(path, sizeof path, "%s/.lutra_history", home);
  return path;
}

int lt_repl(lua_State *L) {
  volatile int errors = 0; /* (kept across the prompt's siglongjmp) */
  repl_L = L;
  repl_thread = pthread_self();
  int tty = isatty(STDIN_FILENO);
  const char *hist = tty ? history_path() : NULL;
  if (tty) {
    rl_readline_name = "lutra";
    /* libedit's own SIGINT handler would be skipped by the jump below and
       leave its handlers (and its copy of ours) behind: a later Ctrl-C could
       then kill lutra, or Ctrl-D be read as a character. Ours alone. */
    rl_catch_signals = 0;
    rl_initialize();
    rl_attempted_completion_function = complete;
    rl_completer_word_break_characters = " \t\n\"\\'`><=;+-*/%^~#{}()[],&|";
    rl_completion_append_character = '\0';
    stifle_history(HISTORY_MAX);
    if (hist)
      read_history(hist);
    printf("lutra %s (%s). lt is the library; Ctrl-D leaves.\n", lt_version(), LUAJIT_VERSION);
    fflush(stdout);
  }
  for (;;) {
    char *text = NULL;
    int st;
    if (tty) {
      signal(SIGINT, on_prompt_sigint);
      if (sigsetjmp(prompt_jump, 1)) {
        /* Ctrl-C at the prompt: drop the line (libedit's buffer too) and
           the terminal settings readline made, start again */
        at_prompt = 0;
        rl_replace_line("", 0);
        rl_free_line_state();
        rl_cleanup_after_signal();
        fputs("\n", stdout);
        lua_settop(L, 0);
        continue;
      }
      at_prompt = 1;
    }
    st = load_entry(L, tty, &text);
    at_prompt = 0;
    if (tty)
      signal(SIGINT, SIG_DFL);
    if (st == -1)
      break;
    if (tty && text && text[strspn(text, " \t")]) {
      add_history(text);
      if (hist)
        write_history(hist);
    }
    free(text);
    if (st == 0) {
      int base = lua_gettop(L);
      st = lt_docall(L, 0, LUA_MULTRET);
      if (st == 0) {
        int nres = lua_gettop(L) - base + 1;
        if (nres > 0) {
          lua_pushinteger(L, nres);
          lua_insert(L, base);
          if (call_helper(L, "show", nres + 1, 0) != 0)
            lt_report(L, 1);
        }
      }
    }
    if (st != 0) {
      lt_report(L, st);
      errors++;
    }
    lua_settop(L, 0);
    fflush(stdout);
  }
  if (tty) {
    fputs("\n", stdout);
    if (hist)
      history_truncate_file(hist, HISTORY_MAX);
  }
  fflush(stdout);
  return errors;
}
