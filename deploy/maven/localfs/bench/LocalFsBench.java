import java.io.File;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;

/**
 * The cost of one checkpoint file on the local file system: written to a temporary name
 * (with its .crc) and renamed into place, as Spark's FileSystem checkpoint manager does.
 * Run from the project root, once per class, as a single-file program:
 *
 *   java -Xmx4g -cp ".lib/localfs/*:.venv/lib/python3.11/site-packages/pyspark/jars/*" \
 *     deploy/maven/localfs/bench/LocalFsBench.java CLASS FOLDER FILES
 *
 * with CLASS org.apache.hadoop.fs.LocalFileSystem (Hadoop's) or
 * io.delayq.hadoop.NioLocalFileSystem (delayq's). A first round warms the JVM up.
 */
public class LocalFsBench {
  public static void main(String[] args) throws Exception {
    Configuration conf = new Configuration();
    conf.set("fs.file.impl", args[0]);
    FileSystem fs = FileSystem.getLocal(conf);
    Path dir = new Path(new Path(new File(args[1]).toURI()), args[0]);
    fs.mkdirs(dir);
    int files = Integer.parseInt(args[2]);
    byte[] data = new byte[512];
    for (int round = 0; round < 2; round++) {
      long start = System.nanoTime();
      for (int i = 0; i < files; i++) {
        Path tmp = new Path(dir, "." + i + "-" + round + ".tmp");
        try (FSDataOutputStream out = fs.create(tmp, true)) {
          out.write(data);
        }
        fs.rename(tmp, new Path(dir, i + "-" + round));
      }
      if (round == 1) {
        System.out.printf("%s: %d files written and renamed, %.2f ms per file%n",
            fs.getClass().getName(), files, (System.nanoTime() - start) / 1e6 / files);
      }
    }
  }
}
