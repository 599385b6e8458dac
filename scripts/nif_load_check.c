// Loads a NIF library the way the VM does (dlopen, then its nif_init) and
// prints the module name and function count of its entry. The enif_*
// functions it imports are left unresolved (RTLD_LAZY): nif_init does not
// call them. Used by scripts/check_precompiled.sh, under qemu-user for a
// foreign architecture.
#include <dlfcn.h>
#include <stdio.h>

struct entry {  // The head of ErlNifEntry (erl_nif.h).
  int major, minor;
  const char* name;
  int num_of_funcs;
};

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  void* library = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
  if (!library) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  const struct entry* (*init)(void) = (const struct entry* (*)(void))dlsym(library, "nif_init");
  if (!init) {
    fprintf(stderr, "no nif_init: %s\n", dlerror());
    return 1;
  }
  const struct entry* e = init();
  printf("loaded %s: NIF %d.%d, module %s, %d functions\n", argv[1], e->major, e->minor, e->name, e->num_of_funcs);
  return 0;
}
