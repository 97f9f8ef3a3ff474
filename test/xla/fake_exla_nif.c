/* A stand-in for EXLA's NIF: linked against the stand-in
 * libxla_extension.so (DT_NEEDED, found through its rpath), so that loading
 * it loads "XLA" into the VM the way EXLA does, RTLD_LOCAL. It reads back
 * what was registered with that XLA. */
#include <erl_nif.h>
#include <string.h>

int fake_xla_registrations_text(char *buf, int len);

static ERL_NIF_TERM registrations(ErlNifEnv *env, int argc, const ERL_NIF_TERM argv[])
{
    (void)argc;
    (void)argv;
    static char buf[65536];
    int n = fake_xla_registrations_text(buf, (int)sizeof buf);
    ERL_NIF_TERM bin;
    unsigned char *data = enif_make_new_binary(env, (size_t)n, &bin);
    memcpy(data, buf, (size_t)n);
    return bin;
}

static ErlNifFunc funcs[] = {{"registrations", 0, registrations, 0}};

ERL_NIF_INIT(fusex_fake_exla, funcs, NULL, NULL, NULL, NULL)
