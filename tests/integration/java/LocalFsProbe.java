import java.io.File;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * What Spark's checkpoint writer does to the local file system, through the file system class
 * named by args[0], in the folder args[1]: a directory made with a mode, a file created under
 * the umask (and its .crc beside it), the file's mode changed. Prints the class it ran.
 * Launched by tests/integration/test_localfs.py as a single-file program.
 */
public class LocalFsProbe {
  public static void main(String[] args) throws Exception {
    Configuration conf = new Configuration();
    conf.set("fs.file.impl", args[0]);
    conf.set("fs.permissions.umask-mode", "027");
    FileSystem fs = FileSystem.getLocal(conf);
    Path dir = new Path(new Path(new File(args[1]).toURI()), "made");
    if (!fs.mkdirs(dir, new FsPermission((short) 0750))) {
      throw new IllegalStateException("mkdirs " + dir);
    }
    Path file = new Path(dir, "created");
    try (FSDataOutputStream out = fs.create(file, true)) {
      out.write(new byte[] {1, 2, 3});
    }
    Path changed = new Path(dir, "changed");
    try (FSDataOutputStream out = fs.create(changed, true)) {
      out.write(4);
    }
    fs.setPermission(changed, new FsPermission((short) 0600));
    System.out.println("class=" + fs.getClass().getName());
  }
}
