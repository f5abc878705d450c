/*
 * An MPI job (Open MPI, 4 ranks) for the real-program tests. Run as
 * `mpirun -np 4 mpi_job WORKDIR ROUNDS [PAUSE_US]`. Each round every rank passes a
 * token around the ring (MPI_Sendrecv) and the ranks agree on a sum
 * (MPI_Allreduce); every value depends on the previous round, so a lost,
 * repeated or reordered message changes the end result. Rank 0 writes
 * WORKDIR/progress (rounds done) now and then and, at the end,
 * WORKDIR/result: "PASS <checksum>" if the result equals the one computed
 * locally without MPI, else "FAIL ...". Every round ends with a pause
 * (PAUSE_US microseconds, 2000 unless given), which sets a floor under the
 * job's length however fast the transport is.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t step(uint64_t x, uint64_t salt)
{
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return x + salt;
}

static void write_file(const char *dir, const char *name, const char *text)
{
	char tmp[4096], dst[4096];
	snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
	snprintf(dst, sizeof dst, "%s/%s", dir, name);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	fputs(text, f);
	fclose(f);
	rename(tmp, dst);
}

/* The same computation on one process: what the ring must produce. */
static uint64_t expected(int size, long rounds)
{
	uint64_t v[64];
	for (int r = 0; r < size; r++)
		v[r] = 1000 + r;
	for (long i = 0; i < rounds; i++) {
		uint64_t from_left[64], sum = 0;
		for (int r = 0; r < size; r++)
			from_left[r] = v[(r + size - 1) % size];
		for (int r = 0; r < size; r++) {
			v[r] = step(v[r] ^ from_left[r], (uint64_t)i);
			sum += v[r];
		}
		for (int r = 0; r < size; r++)
			v[r] ^= step(sum, (uint64_t)r);
	}
	uint64_t total = 0;
	for (int r = 0; r < size; r++)
		total += v[r];
	return total;
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (argc < 3 || size > 64)
		MPI_Abort(MPI_COMM_WORLD, 2);
	const char *dir = argv[1];
	long rounds = atol(argv[2]);
	useconds_t pause_us = argc > 3 ? (useconds_t)atol(argv[3]) : 2000;
	uint64_t v = 1000 + (uint64_t)rank;
	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	for (long i = 0; i < rounds; i++) {
		uint64_t from_left;
		MPI_Sendrecv(&v, 1, MPI_UINT64_T, right, 7, &from_left, 1, MPI_UINT64_T, left, 7,
			     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		v = step(v ^ from_left, (uint64_t)i);
		uint64_t sum;
		MPI_Allreduce(&v, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
		v ^= step(sum, (uint64_t)rank);
		if (rank == 0 && i % 100 == 0) {
			char buf[32];
			snprintf(buf, sizeof buf, "%ld", i);
			write_file(dir, "progress", buf);
		}
		usleep(pause_us);
	}
	uint64_t total;
	MPI_Reduce(&v, &total, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		char buf[128];
		uint64_t want = expected(size, rounds);
		if (total == want)
			snprintf(buf, sizeof buf, "PASS %016llx", (unsigned long long)total);
		else
			snprintf(buf, sizeof buf, "FAIL got %016llx, want %016llx",
				 (unsigned long long)total, (unsigned long long)want);
		write_file(dir, "result", buf);
	}
	MPI_Finalize();
	return 0;
}
