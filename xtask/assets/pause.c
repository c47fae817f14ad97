/*
 * swiftlet test bed pause: the init process of every pod sandbox.
 *
 * It holds the pod's namespaces open by doing nothing. Being PID 1 of the pod's PID
 * namespace (when the pod shares it), it must reap orphaned children, and it must exit
 * promptly and cleanly when the runtime stops the sandbox: PID 1 gets no default signal
 * handlers, so SIGTERM/SIGINT would otherwise be ignored until the runtime's SIGKILL.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
	(void)sig;
	_exit(0);
}

static void on_child(int sig)
{
	(void)sig;
	/* One SIGCHLD may stand for several exits: reap until none is left. */
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(int argc, char **argv)
{
	struct sigaction sa;

	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("swiftlet-pause");
		return 0;
	}

	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = on_stop;
	if (sigaction(SIGINT, &sa, NULL) < 0 || sigaction(SIGTERM, &sa, NULL) < 0) {
		perror("sigaction");
		return 1;
	}
	sa.sa_handler = on_child;
	sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
	if (sigaction(SIGCHLD, &sa, NULL) < 0) {
		perror("sigaction");
		return 1;
	}

	for (;;)
		pause();
}
