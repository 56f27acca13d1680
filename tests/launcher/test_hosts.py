"""Host lists from every source: -H, hostfiles, SLURM's compressed lists, cluster variables; and
how ranks fill the hosts."""
import unittest

from launcher_test_support import bound_memory, package_path

bound_memory()  # the bounds tested here once let a short variable expand into gigabytes
package_path()
from dtrain_launcher import cluster, hosts, slurm  # noqa: E402
from dtrain_launcher.errors import UsageError  # noqa: E402
from dtrain_launcher.hosts import Host  # noqa: E402


class Hostfiles(unittest.TestCase):
    def test_all_three_forms_and_comments(self):
        text = "# cluster\nnode1 slots=4\nnode2:2   # two\n\nnode3\n"
        self.assertEqual(hosts.parse_hostfile_text(text, "f"),
                         [Host("node1", 4), Host("node2", 2), Host("node3", 1)])

    def test_duplicate_host(self):
        with self.assertRaisesRegex(UsageError, "host 'a' is listed twice"):
            hosts.parse_hostfile_text("a slots=1\na slots=2\n", "f")


class Layout(unittest.TestCase):
    def test_ranks_fill_each_host_before_the_next(self):
        layout = hosts.fill([Host("a", 2), Host("b", 3), Host("c", 2)], 4)
        self.assertEqual(layout, [Host("a", 2), Host("b", 2)])
        self.assertEqual(hosts.rank_hosts(layout), ["a", "a", "b", "b"])

    def test_natural_order(self):
        names = ["algo-10", "algo-2", "algo-1", "b", "a"]
        self.assertEqual(sorted(names, key=hosts.natural_key),
                         ["a", "algo-1", "algo-2", "algo-10", "b"])

    def test_natural_order_of_long_digit_runs(self):
        # int() refuses more than 4300 digits; the order must not need it.
        long_name = "n" + "9" * 5000
        self.assertEqual(sorted([long_name, "n10", "n9"], key=hosts.natural_key),
                         ["n9", "n10", long_name])

    def test_ranks_in_messages_are_runs(self):
        from dtrain_launcher.job import ranks_text
        self.assertEqual(ranks_text([1, 3, 4, 5, 9]), "1, 3-5, 9")
        self.assertEqual(ranks_text(range(1 << 20)), "0-1048575")


class SlurmNodeLists(unittest.TestCase):
    def test_ranges_lists_and_padding(self):
        self.assertEqual(slurm.expand_nodelist("node[01-04,07],gpu-a[1-2]"),
                         ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2"])

    def test_plain_names_and_single_numbers(self):
        self.assertEqual(slurm.expand_nodelist("login1,c[5],d[9-10]"),
                         ["login1", "c5", "d9", "d10"])

    def test_several_bracket_groups_expand_as_a_product(self):
        self.assertEqual(slurm.expand_nodelist("r[1-2]n[08-09]"),
                         ["r1n08", "r1n09", "r2n08", "r2n09"])

    def test_padding_kept_across_widths(self):
        self.assertEqual(slurm.expand_nodelist("n[098-101]"), ["n098", "n099", "n100", "n101"])

    def test_errors(self):
        cases = {
            "node[]": "'[]' in 'node[]' is not a list of numbers and ranges like 01-04",
            "node[1-": "'[' without ']' in 'node[1-'",
            "a]b": "']' without '[' in 'a]b'",
            "n[[1]]": "nested '[' in 'n[[1]]'",
            "node[3-1]": "range '3-1' in 'node[3-1]' runs backwards",
            "node[a-b]": "'[a-b]' in 'node[a-b]' is not a list of numbers",
            "a,,b": "empty entry in 'a,,b'",
            "": "SLURM_JOB_NODELIST is empty",
            # Bounded before anything is expanded (Note [Bounded counts]).
            "n[1-1048577]": "'n[1-1048577]' names 1048577 or more nodes; at most 1048576",
            "n[1-99999999999999]": "names 99999999999999 or more nodes",
            "r[1-2000]n[1-2000]": "'r[1-2000]n[1-2000]' names 4000000 or more nodes",
            "a,n[1-1048576]": "'a,n[1-1048576]' names 1048577 or more nodes",
            "n[1-" + "9" * 5000 + "]": "node numbers go up to 1000000000000000000",
            "n\udcff1": "'n\\udcff1' is not a host name",
        }
        for text, message in cases.items():
            with self.subTest(text=text):
                with self.assertRaises(UsageError) as caught:
                    slurm.expand_nodelist(text)
                self.assertIn(message, str(caught.exception))
                self.assertTrue(str(caught.exception).startswith("dtrain: SLURM_JOB_NODELIST"))


class SlurmTaskCounts(unittest.TestCase):
    def test_compressed_counts(self):
        self.assertEqual(slurm.expand_tasks_per_node("2(x3),1"), [2, 2, 2, 1])
        self.assertEqual(slurm.expand_tasks_per_node("4"), [4])
        self.assertEqual(slurm.expand_tasks_per_node("1,3(x2)"), [1, 3, 3])

    def test_bad_counts(self):
        for text in ("2(x)", "x", "2(3)", "0", "2(x0)", "\u00b2", "2(x99999999999)",
                     "2(x" + "9" * 5000 + ")", "9" * 5000, "1048577", "1(x1048576),1"):
            with self.subTest(text=text):
                with self.assertRaisesRegex(UsageError, "dtrain: SLURM_TASKS_PER_NODE="):
                    slurm.expand_tasks_per_node(text)

    def test_largest_counts(self):
        self.assertEqual(len(slurm.expand_tasks_per_node("1(x1048576)")), 1 << 20)
        self.assertEqual(slurm.expand_tasks_per_node("1048576"), [1 << 20])

    def test_bad_count_messages(self):
        cases = {
            "2(x99999999999)": "more than 1048576 task counts (the most ranks one job can have",
            "1048577": "'1048577' gives a node more than 1048576 tasks",
            "\u00b2": "'\u00b2' is not N or N(xR)",
        }
        for text, message in cases.items():
            with self.subTest(text=text):
                with self.assertRaises(UsageError) as caught:
                    slurm.expand_tasks_per_node(text)
                self.assertIn(message, str(caught.exception))

    def test_allocation_from_environment(self):
        env = {"SLURM_JOB_NODELIST": "node[01-03],gpu7", "SLURM_TASKS_PER_NODE": "2(x3),1"}
        self.assertEqual(slurm.hosts_from_env(env),
                         [Host("node01", 2), Host("node02", 2), Host("node03", 2),
                          Host("gpu7", 1)])

    def test_ntasks_per_node_when_no_layout(self):
        env = {"SLURM_NODELIST": "n[1-2]", "SLURM_NTASKS_PER_NODE": "4"}
        self.assertEqual(slurm.hosts_from_env(env), [Host("n1", 4), Host("n2", 4)])

    def test_one_task_per_node_by_default(self):
        self.assertEqual(slurm.hosts_from_env({"SLURM_JOB_NODELIST": "n[1-2]"}),
                         [Host("n1", 1), Host("n2", 1)])

    def test_outside_an_allocation(self):
        self.assertIsNone(slurm.hosts_from_env({}))

    def test_counts_that_do_not_match_the_nodes(self):
        env = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x2)"}
        with self.assertRaisesRegex(UsageError, "gives 2 task counts but SLURM_JOB_NODELIST="
                                                "'n\\[1-3\\]' has 3 nodes"):
            slurm.hosts_from_env(env)


class ClusterHosts(unittest.TestCase):
    def test_dtrain_hosts_sorted_with_default_slots(self):
        env = {"DTRAIN_HOSTS": "w-10,w-2,w-1:4", "DTRAIN_CURRENT_HOST": "w-2"}
        found = cluster.hosts_from_env(env, slots=3)
        self.assertEqual(found.hosts, [Host("w-1", 4), Host("w-2", 3), Host("w-10", 3)])
        self.assertEqual((found.leader, found.current, found.followers),
                         ("w-1", "w-2", ["w-2", "w-10"]))

    def test_sagemaker_hosts_and_gpus(self):
        env = {"SM_HOSTS": '["algo-2", "algo-1"]', "SM_CURRENT_HOST": "algo-1",
               "SM_NUM_GPUS": "8"}
        found = cluster.hosts_from_env(env, slots=None)
        self.assertEqual(found.hosts, [Host("algo-1", 8), Host("algo-2", 8)])
        self.assertEqual(found.leader, "algo-1")

    def test_slots_option_beats_gpus_and_cores_are_last(self):
        env = {"SM_HOSTS": '["a"]', "SM_CURRENT_HOST": "a", "SM_NUM_GPUS": "8"}
        self.assertEqual(cluster.hosts_from_env(env, slots=2).hosts, [Host("a", 2)])
        env["SM_NUM_GPUS"] = "0"
        count, source = cluster.default_slots(env, None)
        self.assertEqual(source, "the cores of this host")
        self.assertGreaterEqual(count, 1)

    def test_errors(self):
        cases = [
            ({}, "dtrain: --cluster needs the list of hosts: set DTRAIN_HOSTS"),
            ({"DTRAIN_HOSTS": "a,b"}, "dtrain: DTRAIN_HOSTS is set but DTRAIN_CURRENT_HOST is not"),
            ({"DTRAIN_HOSTS": "a,b", "DTRAIN_CURRENT_HOST": "c"},
             "dtrain: DTRAIN_CURRENT_HOST='c' is not one of the hosts in DTRAIN_HOSTS (a, b)"),
            ({"DTRAIN_HOSTS": "a,a", "DTRAIN_CURRENT_HOST": "a"},
             "dtrain: DTRAIN_HOSTS lists host 'a' twice"),
            ({"DTRAIN_HOSTS": "a:0", "DTRAIN_CURRENT_HOST": "a"}, "host 'a' has 0 slots"),
            ({"SM_HOSTS": "[algo-1]", "SM_CURRENT_HOST": "algo-1"},
             "dtrain: SM_HOSTS='[algo-1]' is not JSON"),
            ({"SM_HOSTS": '{"a": 1}', "SM_CURRENT_HOST": "a"}, "is not a JSON list of host names"),
            ({"SM_HOSTS": '["a"]'}, "dtrain: SM_HOSTS is set but SM_CURRENT_HOST is not"),
            ({"SM_HOSTS": '["a"]', "SM_CURRENT_HOST": "a", "SM_NUM_GPUS": "lots"},
             "dtrain: SM_NUM_GPUS='lots' is not a whole number"),
            ({"SM_HOSTS": '["a"]', "SM_CURRENT_HOST": "a", "SM_NUM_GPUS": "\u00b2"},
             "dtrain: SM_NUM_GPUS='\u00b2' is not a whole number"),
            ({"SM_HOSTS": '["a"]', "SM_CURRENT_HOST": "a", "SM_NUM_GPUS": "9" * 5000},
             "dtrain: SM_NUM_GPUS='" + "9" * 80 + "'... (5000 characters): a host has at most "
             "1048576 ranks"),
            ({"DTRAIN_HOSTS": "a:1048577", "DTRAIN_CURRENT_HOST": "a"},
             "host 'a' has 1048577 slots; a host has 1 to 1048576"),
            ({"DTRAIN_HOSTS": "a,\udcffb", "DTRAIN_CURRENT_HOST": "a"},
             "dtrain: DTRAIN_HOSTS='a,\\udcffb': '\\udcffb' is not a host name"),
            ({"DTRAIN_HOSTS": "a,b", "DTRAIN_CURRENT_HOST": "\udcff"},
             "dtrain: DTRAIN_CURRENT_HOST='\\udcff' is not one of the hosts"),
            ({"SM_HOSTS": '["a", "\udcff"]', "SM_CURRENT_HOST": "a"},
             "dtrain: SM_HOSTS: '\\udcff' is not a host name"),
        ]
        for env, message in cases:
            with self.subTest(env=env):
                with self.assertRaises(UsageError) as caught:
                    cluster.hosts_from_env(env, slots=None)
                self.assertIn(message, str(caught.exception))


if __name__ == "__main__":
    unittest.main()
