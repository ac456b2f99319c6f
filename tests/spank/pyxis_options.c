/* A SPANK plugin that registers pyxis's srun options from pyxis's own table
 * (tests/fixtures/containers/pyxis_spank_opts.c, included as it is) and, in srun, writes every
 * option given to the file named by $EPD_SPANK_RECORD (see record()). It starts no
 * container: it lets the test SLURM's real srun parse the pyxis lines epdctl renders.
 * Built by scripts/slurm_local.sh against Debian's libslurm-dev spank.h. */
#include <stdio.h>
#include <stdlib.h>
#include <slurm/spank.h>

SPANK_PLUGIN(pyxis, 1)

/* srun (local context) hands each option to its callback: write "CALLBACK VAL OPTARG" to
 * $EPD_SPANK_RECORD; the test maps (callback, val) back to the option through the same table. */
static int record(const char *callback, int val, const char *optarg, int remote)
{
	const char *path = getenv("EPD_SPANK_RECORD");
	FILE *f;
	if (remote || path == NULL)
		return 0;
	f = fopen(path, "a");
	if (f == NULL)
		return 0;
	fprintf(f, "%s %d %s\n", callback, val, optarg ? optarg : "");
	fclose(f);
	return 0;
}

#define RECORDER(cb) \
	static int cb(int val, const char *optarg, int remote) { return record(#cb, val, optarg, remote); }
RECORDER(spank_option_image)
RECORDER(spank_option_mount)
RECORDER(spank_option_workdir)
RECORDER(spank_option_container_name)
RECORDER(spank_option_container_save)
RECORDER(spank_option_container_mount_home)
RECORDER(spank_option_container_remap_root)
RECORDER(spank_option_container_entrypoint)
RECORDER(spank_option_container_entrypoint_log)
RECORDER(spank_option_container_writable)
RECORDER(spank_option_container_env)
RECORDER(spank_option_container_unshare)
#include "pyxis_spank_opts.c"

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	(void)ac; (void)av;
	if (spank_context() != S_CTX_LOCAL && spank_context() != S_CTX_REMOTE)
		return 0;
	for (int i = 0; spank_opts[i].name != NULL; ++i)
		if (spank_option_register(sp, &spank_opts[i]) != ESPANK_SUCCESS)
			return -1;
	return 0;
}
