/*
 * main.c: the lutra executable. Starts a LuaJIT state with lutra's library
 * (bindings/), handles the command line as luajit does (`lutra script.lua a b`
 * with `arg`, -e, -l, -i, -v, `-` for stdin; and --threads=N), runs recipes with strict globals,
 * and enters the REPL (repl.c) when asked or when nothing else is given.
 *
 * Errors: an uncaught Lua error prints "lutra: <message>" and a traceback on
 * stderr (a settings error, lt.config.fail's, prints its message alone) and
 * exits with status 1 (under mpirun with several ranks: "[rank N]
 * lutra: <message>", then MPI_Abort ends the whole job). SIGINT during a call raises "interrupted!"
 * (from a hook in interpreted code, or from the next lutra op: compiled
 * loops that call nothing cannot be stopped this way; a second Ctrl-C ends
 * the process). If nothing took it 2 s later, lutra says why: an op is
 * running (it is taken when the op returns), interrupts are deferred (lt.train's
 * update), or a compiled loop runs. A script or -e code during which a SIGINT
 * arrived exits with status 130 (128 + SIGINT, as shells expect), whether it
 * raised "interrupted!" or caught it and ended (lt.train returns a summary).
 */
#include "../../bindings/bindings.h"
#include "lutra.h"
#include "app/repl.h"

#include <lauxlib.h>
#include <lualib.h>
#include <luajit.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static lua_State *global_L;
static pthread_t lua_thread; /* the thread running global_L (ops mark themselves there) */
static volatile sig_atomic_t sigint_seen; /* a SIGINT arrived during some lt_docall */

static void stop_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  if (!lt_is_interrupted() || lt_interrupt_deferred())
    return; /* a lutra op already raised it, or the deferral's end will */
  lt_clear_interrupt();
  luaL_error(L, "interrupted!");
}

static void on_sigint(int sig) {
  signal(sig, SIG_DFL); /* a second Ctrl-C ends the process */
  sigint_seen = 1;
  lt_interrupt();
  lua_sethook(global_L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  alarm(2); /* on_stuck explains if nothing has taken the interrupt by then */
}

static void say_stuck(const char *a, const char *b, const char *c) {
  char msg[512];
  size_t n = 0;
  const char *parts[] = {"\nlutra: Ctrl-C: ", a, b, c, "\n"};
  for (int i = 0; i < 5; i++)
    for (const char *p = parts[i]; p && *p && n < sizeof msg; p++)
      msg[n++] = *p;
  ssize_t w = write(STDERR_FILENO, msg, n);
  (void)w;
}

/* SIGALRM two seconds after a Ctrl-C that nothing took. Either a lutra op is
   still running on the Lua thread (the interrupt is taken when it returns),
   or interrupts are deferred (lt.train's update), or the running code is a
   JIT-compiled loop that calls neither Lua functions nor lutra ops, which
   LuaJIT cannot interrupt. Only async-signal-safe calls here. */
static void on_stuck(int sig) {
  if (!pthread_equal(pthread_self(), lua_thread)) {
    pthread_kill(lua_thread, sig); /* the op in progress is the Lua thread's */
    return;
  }
  if (!lt_is_interrupted())
    return;
  const char *op = lt_op_running(), *deferred = lt_interrupt_deferred();
  if (deferred) /* (the wider wait: ops run inside it) */
    say_stuck("stopping when ", *deferred ? deferred : "the deferred work", " is done (Ctrl-C again ends lutra)");
  else if (op)
    say_stuck("stopping when ", op, " returns (lutra cannot cut an op short; Ctrl-C again ends lutra)");
  else
    say_stuck("the running code is a compiled Lua loop that Ctrl-C cannot stop; ",
              "press Ctrl-C again to end lutra", NULL);
}

/* A settings error (lt.config.fail: its message is a key of the registry's
   "lutra.settings_errors" set) is the user's to fix, not the code's: its
   message alone, without a traceback. */
static int is_settings_error(lua_State *L, int idx) {
  if (lua_type(L, idx) != LUA_TSTRING)
    return 0;
  lua_getfield(L, LUA_REGISTRYINDEX, "lutra.settings_errors");
  int plain = 0;
  if (lua_istable(L, -1)) {
    lua_pushvalue(L, idx);
    lua_rawget(L, -2);
    plain = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return plain;
}

static int traceback(lua_State *L) {
  if (is_settings_error(L, 1)) {
    lua_pushvalue(L, 1);
    return 1;
  }
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

int lt_docall(lua_State *L, int nargs, int nres) {
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  global_L = L;
  lua_thread = pthread_self();
  lt_clear_interrupt();
  signal(SIGINT, on_sigint);
  signal(SIGALRM, on_stuck);
  int status = lua_pcall(L, nargs, nres, base);
  alarm(0);
  signal(SIGINT, SIG_DFL);
  lua_sethook(L, NULL, 0, 0);
  lt_clear_interrupt();
  lua_remove(L, base);
  /* free what the failed call left behind; not in a job of several ranks,
     where the error ends the job (lt_report): a finalizer there could wait
     for good, freeing an irecv posted ahead (a pipeline's) whose sender
     waits on this rank */
  if (status != 0 && lt_dist_world_size() <= 1)
    lua_gc(L, LUA_GCCOLLECT, 0);
  return status;
}

void lt_report(lua_State *L, int status) {
  if (status == 0 || lua_isnil(L, -1))
    return;
  const char *msg = lua_tostring(L, -1);
  if (lt_dist_world_size() > 1) {
    /* one rank's error ends the whole job: the others would wait forever */
    fprintf(stderr, "[rank %d] lutra: %s\n", lt_dist_rank(), msg ? msg : "(error object is not a string)");
    fflush(stderr);
    lt_dist_abort(1);
  }
  fprintf(stderr, "lutra: %s\n", msg ? msg : "(error object is not a string)");
  fflush(stderr);
  lua_pop(L, 1);
}

static void print_usage(FILE *to) {
  fprintf(to,
          "usage: lutra [options] [script [args]]\n"
          "  -e chunk   run the string chunk (lt is predefined)\n"
          "  -l name    require library name into the global name\n"
          "  -i         enter the REPL after running script\n"
          "  --threads=N  CPU threads for kernels and BLAS (default: the cores lutra may use, or OMP_NUM_THREADS)\n"
          "  -v, --version  show the version and the backends found\n"
          "  -h, --help     show this help\n"
          "  --         stop handling options\n"
          "  -          run standard input as a script\n"
          "With no script and no -e, lutra starts the REPL.\n"
          "Environment: LUTRA_PATH=<source tree> loads lua/ from there instead of the binary.\n");
}

static void print_version(void) {
  const char *info = lt_build_info();
  const char *nl = strchr(info, '\n');
  printf("%.*s\n%s\n%s\n", nl ? (int)(nl - info) : (int)strlen(info), info,
         LUAJIT_VERSION, nl ? nl + 1 : "");
  fflush(stdout);
}

/* Sets the global "lt" to require("lutra") for -e code and the REPL. */
static int define_lt(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushstring(L, "lutra");
  int st = lt_docall(L, 1, 1);
  if (st != 0)
    return st;
  lua_setglobal(L, "lt");
  return 0;
}

/* Loads and runs a script with strict globals and the given arguments. */
static int run_script(lua_State *L, const char *path, int nargs_from, char **argv, int argc) {
  int st = luaL_loadfile(L, path && strcmp(path, "-") == 0 ? NULL : path);
  if (st != 0)
    return st;
  lua_getglobal(L, "require");
  lua_pushstring(L, "lutra.strict");
  if ((st = lt_docall(L, 1, 1)) != 0)
    return st;
  lua_getfield(L, -1, "apply");
  lua_pushvalue(L, -3);
  if ((st = lt_docall(L, 1, 0)) != 0)
    return st;
  lua_pop(L, 1);
  int n = 0;
  for (int i = nargs_from; i < argc; i++, n++)
    lua_pushstring(L, argv[i]);
  return lt_docall(L, n, 0);
}

struct options {
  int script; /* index of the script in argv, or 0 */
  int interactive, version, help, has_e;
  int threads; /* --threads=N, or 0 */
};

/* --threads' value: a whole number 1..1024, or -1 (with the message printed). */
static int parse_threads(const char *v) {
  char *end;
  long n = strtol(v, &end, 10);
  if (!*v || *end || n < 1 || n > 1024) {
    fprintf(stderr, "lutra: --threads needs a whole number of threads 1..1024, got '%s'\n", v);
    return -1;
  }
  return (int)n;
}

/* First pass: find the script and flags; returns 0 or -1 on a bad option. */
static int scan_args(int argc, char **argv, struct options *o) {
  memset(o, 0, sizeof *o);
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-')
      break;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (strcmp(a, "-") == 0)
      break;
    if (strcmp(a, "-i") == 0)
      o->interactive = 1;
    else if (strncmp(a, "--threads", 9) == 0 && (a[9] == '=' || a[9] == 0)) {
      if (a[9] == 0 && ++i >= argc) {
        fprintf(stderr, "lutra: '--threads' needs an argument\n");
        return -1;
      }
      if ((o->threads = parse_threads(a[9] ? a + 10 : argv[i])) < 0)
        return -1;
    }
    else if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0)
      o->version = 1;
    else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
      o->help = 1;
    else if (strcmp(a, "-e") == 0 || strcmp(a, "-l") == 0) {
      if (a[1] == 'e')
        o->has_e = 1;
      if (++i >= argc) {
        fprintf(stderr, "lutra: '%s' needs an argument\n", a);
        return -1;
      }
    } else if ((a[1] == 'e' || a[1] == 'l') && a[2]) {
      if (a[1] == 'e')
        o->has_e = 1;
    } else {
      fprintf(stderr, "lutra: unrecognized option '%s'\n", a);
      return -1;
    }
  }
  o->script = i < argc ? i : 0;
  return 0;
}

/* arg[0] is the script, arg[1..] its arguments, arg[-k] what came before. */
static void create_arg_table(lua_State *L, int argc, char **argv, int script) {
  int zero = script ? script : argc;
  lua_createtable(L, argc - zero, zero);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - zero);
  }
  lua_setglobal(L, "arg");
}

/* Second pass: run -e and -l in order. */
static int run_options(lua_State *L, int argc, char **argv, int stop) {
  for (int i = 1; i < stop; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || (a[1] != 'e' && a[1] != 'l'))
      continue;
    const char *val = a[2] ? a + 2 : (i + 1 < argc ? argv[++i] : "");
    int st;
    if (a[1] == 'e') {
      st = luaL_loadbuffer(L, val, strlen(val), "=(command line)");
      if (st == 0)
        st = lt_docall(L, 0, 0);
    } else {
      lua_getglobal(L, "require");
      lua_pushstring(L, val);
      st = lt_docall(L, 1, 1);
      if (st == 0)
        lua_setglobal(L, val);
    }
    if (st != 0)
      return st;
  }
  return 0;
}

struct pmain_args {
  int argc;
  char **argv;
  int status;
};

static int pmain(lua_State *L) {
  struct pmain_args *pa = lua_touserdata(L, 1);
  int argc = pa->argc;
  char **argv = pa->argv;
  struct options o;
  if (scan_args(argc, argv, &o) != 0) {
    print_usage(stderr);
    pa->status = 1;
    return 0;
  }
  if (o.help) { /* (asked for: on stdout, so it pages) */
    print_usage(stdout);
    fflush(stdout);
    return 0;
  }
  if (o.version) {
    print_version();
    return 0;
  }
  lua_gc(L, LUA_GCSTOP, 0);
  luaL_openlibs(L);
  lua_gc(L, LUA_GCRESTART, -1);
  if (o.threads > 0)
    lt_set_num_threads(o.threads);
  lt_bindings_open(L);
  create_arg_table(L, argc, argv, o.script);
  int st = 0;
  int want_repl = o.interactive || (!o.script && !o.has_e);
  if (o.has_e || want_repl)
    st = define_lt(L);
  if (st == 0)
    st = run_options(L, argc, argv, o.script ? o.script : argc);
  if (st == 0 && o.script)
    st = run_script(L, argv[o.script], o.script + 1, argv, argc);
  if (st != 0) {
    lt_report(L, st);
    pa->status = sigint_seen ? 130 : 1;
    return 0;
  }
  if (sigint_seen && !want_repl) { /* interrupted, and the script stopped itself cleanly */
    pa->status = 130;
    return 0;
  }
  if (want_repl && lt_repl(L) > 0 && !isatty(STDIN_FILENO))
    pa->status = 1; /* (piped input that raised: as a script that did) */
  return 0;
}

/*
 * Threads that spin while idle take the cores that the other pool's threads
 * need: OpenMP threads after a parallel region, OpenBLAS's threads (calling
 * sched_yield) after a matrix product. Measured on 2 cores: a GPT-2 124M
 * step went from 4.7 s to 3.2 s with passive OpenMP waiting, and a small
 * GPT-2 training step from about 430 to 400 ms with OpenBLAS's shortest spin
 * (OPENBLAS_THREAD_TIMEOUT=4, 2^4 cycles). Both libraries read these when they
 * load, before main, so lutra sets them and runs itself again; a variable the
 * user set is left as it is.
 */
static void prefer_passive_threads(char **argv) {
  int changed = 0;
  if (!getenv("OMP_WAIT_POLICY"))
    changed = !setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  if (!getenv("OPENBLAS_THREAD_TIMEOUT"))
    changed |= !setenv("OPENBLAS_THREAD_TIMEOUT", "4", 1);
  if (changed)
    execv("/proc/self/exe", argv); /* returns only on failure: carry on as is */
}

int main(int argc, char **argv) {
  prefer_passive_threads(argv);
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "lutra: cannot create a Lua state: not enough memory\n");
    return 1;
  }
  struct pmain_args pa = {argc, argv, 0};
  int st = lua_cpcall(L, pmain, &pa);
  if (st != 0) {
    lt_report(L, st);
    pa.status = 1;
  }
  fflush(stdout);
  lua_close(L);
  lt_dist_finalize();
  return pa.status;
}
